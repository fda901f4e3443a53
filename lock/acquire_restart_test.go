package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// A racing Acquire (as Campaign uses it) waiting when the store restarts
// and loses the key holds off a TTL after its reconnect: the holder, cut
// off, still counts on the key until its renew deadline.
func TestAcquireHoldsOffAfterStoreRestart(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := "plain"
		if fence {
			name = "FenceKey"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			proxy := startProxy(t, srv.Addr())
			ttl := 2 * time.Second
			cfg := lock.Config{Name: "l", TTL: ttl, Race: true, FenceKey: fence}
			a := newLock(t, dial(t, proxy.Addr()), cfg)
			cb := dial(t, srv.Addr())
			mustLock(t, a)
			got := make(chan error, 1)
			var b *lock.Lock
			go func() {
				var err error
				b, err = lock.Acquire(testCtx(t), cb, cfg)
				got <- err
			}()
			waitFor(t, "b to watch the key", func() bool { return srv.Watching(cb.ID(), "l") })
			proxy.Partition()
			down := time.Now()
			restartStore(t, srv, 100*time.Millisecond)
			if err := <-got; err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			took := time.Since(down)
			select {
			case <-a.Done():
			default:
				t.Fatalf("b took the lock %v after the restart while a still held it", took)
			}
			if took < ttl {
				t.Errorf("b took the lock %v after the restart, less than a TTL", took)
			}
			proxy.Heal()
			if err := b.Unlock(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			_ = b.Close(context.Background())
			if err := a.Close(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
