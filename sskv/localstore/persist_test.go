package localstore_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func startPersisting(t *testing.T, mode localstore.PersistMode, dir string) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(localstore.Config{Persist: mode, DataDir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

func restart(t *testing.T, srv *localstore.Server) *localstore.Server {
	t.Helper()
	next, err := srv.Restart(storetest.Ctx(t), 0)
	if err != nil {
		t.Fatalf("Restart: %v", err)
	}
	t.Cleanup(func() { _ = next.Close() })
	return next
}

func mustGet(t *testing.T, c *sskv.Client, key string) sskv.GetResult {
	t.Helper()
	r, err := c.Get(storetest.Ctx(t), key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	return r
}

// TestPersistDynamicRestart: in dynamic mode a key whose SET asked for
// persistence comes back after a restart with its value, version and
// fencing token; a key that did not ask is lost; a later SET without the
// property takes the key off disk; a DEL of a persisted key stays deleted;
// and the store's versions go on above every one issued before.
func TestPersistDynamicRestart(t *testing.T) {
	dir := t.TempDir()
	srv := startPersisting(t, localstore.PersistDynamic, dir)
	c := storetest.Dial(t, srv.Addr())
	ctx := storetest.Ctx(t)

	token := hlc.Timestamp{Wall: time.Now().UnixMilli(), Counter: 5, Node: "holder"}
	kept, err := c.Set(ctx, "kept", []byte("v1"), sskv.SetOptions{Persist: true, FencingToken: token})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"unpersisted-later", "deleted"} {
		if _, err := c.Set(ctx, k, []byte("p"), sskv.SetOptions{Persist: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Set(ctx, "unpersisted-later", []byte("memory only"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Del(ctx, "deleted", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	lost, err := c.Set(ctx, "lost", []byte("x"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	_ = restart(t, srv)
	got := mustGet(t, c, "kept")
	if !got.Found || string(got.Value) != "v1" || got.Version != kept.Version {
		t.Fatalf("persisted key after restart: %+v, want v1 at %v", got, kept.Version)
	}
	for _, k := range []string{"lost", "unpersisted-later", "deleted"} {
		if r := mustGet(t, c, k); r.Found {
			t.Errorf("%s came back after the restart: %+v", k, r)
		}
	}
	older := token
	older.Counter--
	if _, err := c.Set(ctx, "kept", []byte("v2"), sskv.SetOptions{FencingToken: older, Persist: true}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("SET with an older token after the restart: %v, want ErrFencingTokenLower", err)
	}
	next, err := c.Set(ctx, "new", []byte("n"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if next.Version.Compare(lost.Version) <= 0 || next.Version.Compare(kept.Version) <= 0 {
		t.Fatalf("version after the restart %v is not above those before (%v, %v)", next.Version, kept.Version, lost.Version)
	}
}

// TestPersistAllExpiry: in mode all every key persists; a key's expiry is a
// deadline that keeps running while the store is down: a key whose
// deadline passed during the down time is gone, one whose deadline is
// still ahead comes back and expires on time.
func TestPersistAllExpiry(t *testing.T) {
	srv := startPersisting(t, localstore.PersistAll, t.TempDir())
	c := storetest.Dial(t, srv.Addr())
	ctx := storetest.Ctx(t)
	if _, err := c.Set(ctx, "short", []byte("s"), sskv.SetOptions{Expiry: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "long", []byte("l"), sskv.SetOptions{Expiry: time.Hour}); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	if _, err := c.Set(ctx, "soon", []byte("s"), sskv.SetOptions{Expiry: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	next, err := srv.Restart(ctx, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	if r := mustGet(t, c, "short"); r.Found {
		t.Fatalf("a key whose deadline passed while the store was down came back: %+v", r)
	}
	if r := mustGet(t, c, "long"); !r.Found {
		t.Fatal("a key with an hour to live was lost")
	}
	if r := mustGet(t, c, "soon"); !r.Found && time.Since(set) < 1400*time.Millisecond {
		t.Fatal("a key with 1.5 s to live was lost after 0.5 s")
	}
	storetest.Eventually(t, "the key to expire after the restart", func() bool { return next.Len() == 1 })
	if e := time.Since(set); e < 1450*time.Millisecond { // the wall and monotonic clocks may differ by a little

		t.Fatalf("the key expired %v after its SET, before its 1.5 s", e)
	}
}

// TestPersistBadStart: a store refuses to start, with an error that says
// why, on a data directory it cannot write, on a corrupt or foreign file,
// and on a directory another store has open.
func TestPersistBadStart(t *testing.T) {
	dir := t.TempDir()
	srv := startPersisting(t, localstore.PersistAll, dir)
	_, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: dir})
	if !errors.Is(err, localstore.ErrDataDirInUse) {
		t.Fatalf("a second store on the same directory: %v, want ErrDataDirInUse", err)
	}
	_ = srv.Close()

	for name, content := range map[string][]byte{
		"garbage":   bytes.Repeat([]byte("not a database "), 1000),
		"truncated": nil, // filled below
	} {
		d := t.TempDir()
		if name == "truncated" {
			b, err := os.ReadFile(filepath.Join(dir, "statestore.db"))
			if err != nil {
				t.Fatal(err)
			}
			content = b[:len(b)/3]
		}
		if err := os.WriteFile(filepath.Join(d, "statestore.db"), content, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: d})
		if err == nil || !strings.Contains(err.Error(), "statestore.db") {
			t.Errorf("%s file: Start: %v, want an error naming the file", name, err)
		}
	}

	// Pages in the middle of a real data file overwritten: the store fails
	// to start, naming the file, and again the next time (the failed start
	// released the file's lock).
	mangled := t.TempDir()
	if err := localstore.FillDataDir(mangled, 5000, 64); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(mangled, "statestore.db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	for off := int64(3 * 4096); off < fi.Size(); off += 5 * 4096 {
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xA5}, 600), off+100); err != nil {
			t.Fatal(err)
		}
	}
	_ = f.Close()
	for range 2 {
		_, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: mangled})
		if err == nil || !strings.Contains(err.Error(), "statestore.db") || errors.Is(err, localstore.ErrDataDirInUse) {
			t.Fatalf("a data file with mangled pages: Start: %v, want an error naming the file", err)
		}
		t.Logf("mangled pages: %v", err)
	}

	if os.Geteuid() != 0 {
		ro := t.TempDir()
		if err := os.Chmod(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		_, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: ro})
		if err == nil || !strings.Contains(err.Error(), "not writable") {
			t.Errorf("read-only directory: %v", err)
		}
	}
	file := filepath.Join(t.TempDir(), "file")
	_ = os.WriteFile(file, nil, 0o600)
	if _, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: filepath.Join(file, "sub")}); err == nil {
		t.Error("a data directory under a file: no error")
	}
	if _, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll}); err == nil {
		t.Error("Persist without DataDir: no error")
	}
	if _, err := localstore.Start(localstore.Config{DataDir: t.TempDir()}); err == nil {
		t.Error("DataDir without Persist: no error")
	}
}

// TestPersistEmptyDataFile: a data file cut to nothing (a truncation, a
// failed copy) fails the start, naming the file, as one cut anywhere else
// does; it is not taken for a new store and started empty. A directory
// without a data file still starts empty, and keeps what it is given.
func TestPersistEmptyDataFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "statestore.db"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: dir})
	if err == nil {
		_ = srv.Close()
		t.Fatal("a store started on an empty data file")
	}
	if !strings.Contains(err.Error(), "statestore.db") {
		t.Fatalf("Start on an empty data file: %v, want an error naming the file", err)
	}

	fresh := t.TempDir()
	srv = startPersisting(t, localstore.PersistAll, fresh)
	c := storetest.Dial(t, srv.Addr())
	if _, err := c.Set(storetest.Ctx(t), "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	restart(t, srv)
	if r := mustGet(t, c, "k"); string(r.Value) != "v" {
		t.Fatalf("a key in a new data directory after a restart: %+v", r)
	}
	if names, _ := filepath.Glob(filepath.Join(fresh, "*")); len(names) != 1 {
		t.Errorf("the data directory holds %v, want the data file alone", names)
	}
}
