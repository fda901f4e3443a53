package lock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// A Lock that kept the queue (it waited for the lock, and waiters joined
// it) loses its holding while it is cut off from the store, so that its
// release, if it tries one, cannot go out. Another waiter takes the key
// once it expires. When the first Lock waits again, it joins the new
// holder, and the new holder's release hands it the lock: it must take it
// at once, not stay deaf to its turn until its safeguard check, ten TTLs
// later (it still counted itself the queue's keeper).
func TestLockTakesItsTurnAfterAnUnreleasedLoss(t *testing.T) {
	for _, fenceKey := range []bool{false, true} {
		for _, unlock := range []bool{true, false} {
			t.Run(fmt.Sprintf("FenceKey=%v/Unlock=%v", fenceKey, unlock), func(t *testing.T) {
				lockAfterUnreleasedLoss(t, fenceKey, unlock)
			})
		}
	}
}

func lockAfterUnreleasedLoss(t *testing.T, fenceKey, unlock bool) {
	const ttl = 500 * time.Millisecond
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "q", TTL: ttl, FenceKey: fenceKey}
	observer := dial(t, srv.Addr())

	// a keeps the queue: it waited for the lock, and holds it.
	proxy := startProxy(t, srv.Addr())
	a := queueKeeper(t, srv, dial(t, proxy.Addr()), cfg)
	// b waits behind it.
	b := newLock(t, dial(t, srv.Addr()), cfg)
	bGot := queuedLock(t, observer, b)

	// a is cut off: its holding is lost, and b takes the key once it
	// expires.
	proxy.Partition()
	select {
	case <-a.Done():
	case <-time.After(waitTimeout):
		t.Fatal("a's holding did not end")
	}
	if unlock {
		if err := a.Unlock(ctx); err == nil {
			t.Fatal("a.Unlock while cut off = nil; want an error")
		}
	}
	if err := <-bGot; err != nil {
		t.Fatalf("b.Lock: %v", err)
	}
	proxy.Heal()

	// a waits again, behind b. It reconnected after an outage, so it takes
	// no free key within a TTL of its reconnection (see Lock): a plain Lock
	// takes its turn within about a TTL of b's release; with FenceKey, the
	// key is reserved for it, and it takes it at once.
	aGot := queuedLock(t, observer, a)
	start := time.Now()
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-aGot:
		if err != nil {
			t.Fatalf("a.Lock: %v", err)
		}
	case <-time.After(4 * ttl):
		t.Fatalf("b handed a the lock, and a had not taken it %v later (TTL %v)", time.Since(start), ttl)
	}
	t.Logf("a took its turn %v after b's release", time.Since(start).Round(time.Millisecond))
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
