package lock_test

import (
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A reader's connection freezes (localstore.Hold, Both) just after its
// slot's SET was answered: the reader checks the gate (no request: its
// connection is up), then gives the gate back, whose VDEL waits up to
// RenewDeadline for an answer. The slot's renewals are frozen meanwhile,
// so its renew deadline passes before RLock returns: RLock reports the
// read held with a holding that is already lost (FencingToken fails), where
// Lock.Lock promises at least RenewDeadline. A writer could be let in
// while the caller, told it holds the read lock, starts its work.
func TestReviewRWMutexRLockReturnsLostSlot(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	rc := storetest.DialPatient(t, srv.Addr(), "")
	t.Cleanup(func() { srv.Release(rc.ID()) })
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 1, TTL: time.Second}
	cfg.Logger = newHook("acquired", lock.RWMutexReader("m", 0), func() {
		if err := srv.Hold(rc.ID(), localstore.Both); err != nil {
			t.Error(err)
		}
	})
	r := newRW(t, rc, cfg)
	start := time.Now()
	if err := r.RLock(ctx); err != nil {
		t.Fatalf("RLock: %v", err)
	}
	took := time.Since(start)
	if _, err := r.FencingToken(); err != nil {
		t.Errorf("RLock returned nil after %v, but its holding is lost already: %v", took.Round(time.Millisecond), err)
	}
}

// The same for a Semaphore whose Acquire took a slot at the gate: it leaves
// the gate (Unlock, bounded by a TTL) before it returns, and a connection
// that freezes just after the slot's SETs were answered makes Acquire
// return nil with the slot already past its renew deadline, though
// Acquire's documentation promises "at least RenewDeadline before it could
// be lost".
func TestReviewSemaphoreAcquireReturnsLostSlot(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: time.Second}
	h := newSemaphore(t, dial(t, srv.Addr()), cfg)
	if err := h.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	wc := storetest.DialPatient(t, srv.Addr(), "")
	t.Cleanup(func() { srv.Release(wc.ID()) })
	wcfg := cfg
	wcfg.Logger = newHook("acquired", lock.SemaphoreSlot("s", 0), func() {
		if err := srv.Hold(wc.ID(), localstore.Both); err != nil {
			t.Error(err)
		}
	})
	w := newSemaphore(t, wc, wcfg)
	got := make(chan error, 1)
	go func() { got <- w.Acquire(ctx) }()
	waitFor(t, "w to hold the gate and watch the slot", func() bool { return srv.Watching(wc.ID(), lock.SemaphoreSlot("s", 0)) })
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := <-got; err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	took := time.Since(released)
	if _, err := w.FencingToken(); err != nil {
		t.Errorf("Acquire returned nil %v after the slot was freed, but its holding is lost already: %v", took.Round(time.Millisecond), err)
	}
}
