//go:build linux

package localstore_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestPersistDiskFull fills a small tmpfs (it needs root, to mount it): a
// persisted SET that does not fit fails with MsgPersistFailed and leaves
// the key as it was, while reads and writes not persisted go on; after a
// restart every acknowledged persisted key is there.
func TestPersistDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "full")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) }) // after the store closes (cleanups run last first)
	srv := startPersisting(t, localstore.PersistDynamic, dir)
	c := storetest.Dial(t, srv.Addr())
	ctx := storetest.Ctx(t)

	value := make([]byte, 32<<10)
	var stored []string
	var full error
	for i := 0; i < 100 && full == nil; i++ {
		key := fmt.Sprintf("big-%d", i)
		if _, err := c.Set(ctx, key, value, sskv.SetOptions{Persist: true}); err != nil {
			full = err
			break
		}
		stored = append(stored, key)
	}
	var se *sskv.ServiceError
	if !errors.As(full, &se) || se.Message != localstore.MsgPersistFailed {
		t.Fatalf("after %d persisted SETs of 32 KiB on a 1 MiB disk: %v, want %q", len(stored), full, localstore.MsgPersistFailed)
	}
	failed := fmt.Sprintf("big-%d", len(stored))
	if r := mustGet(t, c, failed); r.Found {
		t.Fatalf("the SET that failed left its key: %+v", r)
	}
	if r := mustGet(t, c, stored[0]); !r.Found {
		t.Fatal("a persisted key is gone after a failed write")
	}
	if _, err := c.Set(ctx, "memory-only", []byte("m"), sskv.SetOptions{}); err != nil {
		t.Fatalf("a SET not persisted on a full disk: %v", err)
	}
	if r := mustGet(t, c, "memory-only"); !r.Found {
		t.Fatal("a key not persisted was not stored on a full disk")
	}

	next := restart(t, srv)
	_ = next
	for _, k := range stored {
		if r := mustGet(t, c, k); !r.Found || len(r.Value) != len(value) {
			t.Fatalf("%s, acknowledged before the disk filled, after a restart: found %v, %d bytes", k, r.Found, len(r.Value))
		}
	}
	t.Logf("%d persisted SETs of 32 KiB fit on the 1 MiB disk", len(stored))
}

// TestPersistDiskFullOthersGoOn: while persisted writes fail on a full
// disk, the requests that touch no key whose write failed (reads, and
// writes not persisted, of other keys) are answered as they were
// executed, not with MsgPersistFailed: the store executed them and does
// not undo them, so an error would tell their client that a write which
// stands had failed. And once space is freed, persisted writes work again.
func TestPersistDiskFullOthersGoOn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "full")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, 0) })
	srv := startPersisting(t, localstore.PersistDynamic, dir)
	pc, mc := storetest.Dial(t, srv.Addr()), storetest.Dial(t, srv.Addr())
	ctx := storetest.Ctx(t)

	value := make([]byte, 32<<10)
	full := false
	for i := 0; i < 100 && !full; i++ {
		_, err := pc.Set(ctx, fmt.Sprintf("big-%d", i), value, sskv.SetOptions{Persist: true})
		full = err != nil
	}
	if !full {
		t.Fatal("100 persisted SETs of 32 KiB fit on a 1 MiB disk")
	}
	if _, err := mc.Set(ctx, "memory-read", []byte("r"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}

	// Persisted writes that keep failing, from 4 writers, while another
	// client reads and writes keys not persisted.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := pc.Set(ctx, fmt.Sprintf("more-%d-%d", w, i), value, sskv.SetOptions{Persist: true}); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	var errs []error
	for i := range 200 {
		if _, err := mc.Set(ctx, fmt.Sprintf("memory-%d", i%10), []byte(fmt.Sprint(i)), sskv.SetOptions{}); err != nil {
			errs = append(errs, err)
		}
		if _, err := mc.Get(ctx, "memory-read"); err != nil {
			errs = append(errs, err)
		}
	}
	close(stop)
	wg.Wait()
	if failed.Load() == 0 {
		t.Fatal("no persisted write failed while the disk was full")
	}
	if len(errs) > 0 {
		t.Fatalf("%d of 400 reads and writes not persisted failed while persisted writes failed (%d); the first: %v", len(errs), failed.Load(), errs[0])
	}

	// Free space: persisted writes work again.
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size=8m"); err != nil {
		t.Fatalf("growing the tmpfs: %v", err)
	}
	if _, err := pc.Set(ctx, "after-space-freed", []byte("v"), sskv.SetOptions{Persist: true}); err != nil {
		t.Fatalf("a persisted SET once space is freed: %v", err)
	}
}
