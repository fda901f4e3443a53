package lock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
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
	inbox := func(l *lock.Lock) *sskv.Watcher {
		w, err := observer.Watch(ctx, "q\x00inbox\x00"+l.HolderID())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		return w
	}
	// answered waits for a message in w's inbox from the holder (the
	// answer to a join).
	answered := func(w *sskv.Watcher, what string) {
		t.Helper()
		for {
			select {
			case ev, ok := <-w.Events():
				if !ok {
					t.Fatalf("%s: the observer's watch ended: %v", what, w.Err())
				}
				if ev.Op == sskv.OpSet && len(ev.Value) > 0 && ev.Value[0] != '+' && ev.Value[0] != '*' {
					return
				}
			case <-time.After(waitTimeout):
				t.Fatalf("%s: no answer to the join", what)
			}
		}
	}

	// a keeps the queue: it waited for the lock, and holds it.
	proxy := startProxy(t, srv.Addr())
	a := queueKeeper(t, srv, dial(t, proxy.Addr()), cfg)
	aInbox := inbox(a)
	aGot := make(chan error, 1)
	// b waits behind it.
	b := newLock(t, dial(t, srv.Addr()), cfg)
	bInbox := inbox(b)
	bGot := make(chan error, 1)
	go func() { bGot <- b.Lock(ctx) }()
	answered(bInbox, "b")

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
	go func() { aGot <- a.Lock(ctx) }()
	answered(aInbox, "a, again")
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
