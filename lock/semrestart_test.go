package lock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// TestSemaphoreRestartWhileQueued: a semaphore of 2 with both slots
// held (a, cut off from the store by a partition, and b) and two
// participants queued (c, d). The store restarts (every key lost: slots,
// queue records, inboxes). b reconnects and finds its slot gone; a, still
// partitioned, loses its slot by its renew deadline only. c and d, after
// their reconnect, must hold off a TTL: neither may take a slot while a or
// b may still believe they hold it. Checked by the holders' own views:
// each acquisition's slot must not be held (Done open) by another.
func TestSemaphoreRestartWhileQueued(t *testing.T) {
	srv := startStore(t)
	proxy := startProxy(t, srv.Addr())
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: time.Second}
	a := newSemaphore(t, dial(t, proxy.Addr()), cfg)
	b := newSemaphore(t, dial(t, srv.Addr()), cfg)
	c := newSemaphore(t, dial(t, srv.Addr()), cfg)
	d := newSemaphore(t, dial(t, srv.Addr()), cfg)
	for _, s := range []*lock.Semaphore{a, b} {
		if err := s.Acquire(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	type acq struct {
		who  string
		slot int
		at   time.Time
	}
	var mu sync.Mutex
	var acqs []acq
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	for name, s := range map[string]*lock.Semaphore{"c": c, "d": d} {
		wg.Go(func() {
			if err := s.Acquire(ctx); err != nil {
				return
			}
			mu.Lock()
			acqs = append(acqs, acq{name, s.Slot(), time.Now()})
			mu.Unlock()
		})
	}
	time.Sleep(300 * time.Millisecond) // c and d queue
	slotA, slotB := a.Slot(), b.Slot()
	var aDone, bDone time.Time
	var dmu sync.Mutex
	go func() { <-a.Done(); dmu.Lock(); aDone = time.Now(); dmu.Unlock() }()
	go func() { <-b.Done(); dmu.Lock(); bDone = time.Now(); dmu.Unlock() }()
	proxy.Partition()
	down := time.Now()
	restartStore(t, srv, 100*time.Millisecond)
	wg.Wait()
	proxy.Heal()
	dmu.Lock()
	defer dmu.Unlock()
	t.Logf("a (slot %d) lost %v after the store went down, b (slot %d) %v: %v, %v", slotA, aDone.Sub(down).Round(time.Millisecond), slotB, bDone.Sub(down).Round(time.Millisecond), a.Err(), b.Err())
	if len(acqs) == 0 {
		t.Fatal("neither c nor d acquired after the restart")
	}
	for _, q := range acqs {
		t.Logf("%s took slot %d %v after the store went down", q.who, q.slot, q.at.Sub(down).Round(time.Millisecond))
		for _, h := range []struct {
			name string
			slot int
			done time.Time
		}{{"a", slotA, aDone}, {"b", slotB, bDone}} {
			if q.slot == h.slot && (h.done.IsZero() || q.at.Before(h.done)) {
				t.Errorf("%s took slot %d while %s still held it (its Done closed %v later)", q.who, q.slot, h.name, h.done.Sub(q.at))
			}
		}
	}
	// Closed before the cleanups close the restarted store under them.
	for _, s := range []*lock.Semaphore{a, b, c, d} {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.Close(cctx)
		ccancel()
	}
}
