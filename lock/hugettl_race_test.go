package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// A racing waiter with a TTL so long that its recheck saturates (about 29
// years) must sleep, not check in a loop (cf. TestHugeTTLWaiterSleeps, which
// covers the queued wait only).
func TestHugeTTLRacingWaiterSleeps(t *testing.T) {
	for _, viaAcquire := range []bool{false, true} {
		name := "Lock"
		if viaAcquire {
			name = "Acquire"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			ttl := 30 * 365 * 24 * time.Hour
			cfg := lock.Config{Name: "l", TTL: ttl, Race: true}
			a := newLock(t, dial(t, srv.Addr()), cfg)
			mustLock(t, a)
			cb := dial(t, srv.Addr())
			before := srv.Requests(cb.ID())
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			var err error
			if viaAcquire {
				var l *lock.Lock
				l, err = lock.Acquire(ctx, cb, cfg)
				if l != nil {
					defer l.Close(context.Background())
				}
			} else {
				b := newLock(t, cb, cfg)
				err = b.Lock(ctx)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait = %v; want DeadlineExceeded", err)
			}
			if n := srv.Requests(cb.ID()) - before; n > 8 {
				t.Fatalf("the racing waiter sent %d requests in 500 ms; want a few (check, watch, check, STOP)", n)
			}
		})
	}
}

// One racing waiter with a huge TTL on a client must not keep the client's
// other racing waiters from their safeguard rechecks (the shared rechecks
// heap: its due overflows).
func TestHugeTTLWaiterLeavesOthersRechecks(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	holderC := dial(t, srv.Addr())
	const ttl = 300 * time.Millisecond
	big := lock.Config{Name: "big", TTL: 30 * 365 * 24 * time.Hour, Race: true}
	small := lock.Config{Name: "small", TTL: ttl, Race: true}
	mustLock(t, newLock(t, holderC, big))
	mustLock(t, newLock(t, holderC, small))

	c := dial(t, srv.Addr())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- newLock(t, c, big).Lock(wctx) }()
	waitFor(t, "the big waiter to watch", func() bool { return srv.Watching(c.ID(), "big") })
	go func() { done <- newLock(t, c, small).Lock(wctx) }()
	waitFor(t, "the small waiter to watch", func() bool { return srv.Watching(c.ID(), "small") })
	defer func() {
		cancel()
		<-done
		<-done
	}()
	<-time.After(2 * ttl) // let the small waiter's attempt after its watch go out
	n := srv.Requests(c.ID())
	start := time.Now()
	// Its recheck is due 10.5 to 11 TTLs after its last attempt: 3.3 s.
	waitFor(t, "the small waiter to recheck beside a huge-TTL waiter", func() bool { return srv.Requests(c.ID()) > n })
	t.Logf("small waiter rechecked after %v", time.Since(start))
}
