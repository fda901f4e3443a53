package lock_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// Racing Acquire waiters on one client, asleep while the holder renews,
// have no goroutine but their callers', and send nothing.
func TestAcquireWaitersCostNoGoroutine(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const n = 100
	c := dial(t, srv.Addr())
	for i := range n {
		cfg := lock.Config{Name: fmt.Sprint("l", i), TTL: 3 * time.Second, FenceKey: true, Race: true}
		if _, err := acquire(ctx, t, dial(t, srv.Addr()), cfg); err != nil {
			t.Fatal(err)
		}
	}
	before := runtime.NumGoroutine()
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, n)
	for i := range n {
		cfg := lock.Config{Name: fmt.Sprint("l", i), TTL: 3 * time.Second, FenceKey: true, Race: true}
		go func() {
			_, err := acquire(wctx, t, c, cfg)
			done <- err
		}()
	}
	defer func() {
		cancel()
		for range n {
			<-done
		}
	}()
	waitFor(t, "every waiter to watch", func() bool {
		for i := range n {
			if !srv.Watching(c.ID(), fmt.Sprint("l", i)) {
				return false
			}
		}
		return true
	})
	// Each sent its attempt and its watch (KEYNOTIFY and the read whose
	// state is the watch's first event: what holds the key, checked for
	// lock.ErrNotALock, and whether it was released meanwhile).
	waitFor(t, "the watches", func() bool { return srv.Requests(c.ID()) >= 3*n })
	t.Logf("requests after the watches: %d", srv.Requests(c.ID()))
	// The KEYNOTIFY STOPs etc. are done; let any settle.
	reqs := srv.Requests(c.ID())
	<-time.After(2 * time.Second) // within one TTL: no recheck due; renewals are the holders'
	if d := srv.Requests(c.ID()) - reqs; d != 0 {
		t.Errorf("sleeping waiters sent %d requests in 2 s", d)
	}
	// Goroutines that were ending anyway (a callback of the client's, a
	// timer's) may still be counted on a loaded machine: what must hold is
	// that none stays.
	waitFor(t, fmt.Sprintf("the %d waiters' goroutines to be only their callers'", n), func() bool {
		return runtime.NumGoroutine()-before <= n+5
	})
}
