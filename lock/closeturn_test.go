package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// Close while one Lock call waits for the key and others wait for the
// Lock's turn (a second Lock, a TryLock): every one returns an error
// wrapping ErrClosed, promptly; when the callers' context ends at the
// same moment, context.Canceled may come first. The rounds vary when
// Close comes (a few milliseconds of jitter) to meet the calls at
// different points.
func TestCloseEndsCallsWaitingForTheTurn(t *testing.T) {
	srv := startStore(t)
	for i := range 20 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			key := fmt.Sprintf("l-%d", i)
			cfg := lock.Config{Name: key, TTL: time.Minute, Race: i%3 != 2, FenceKey: i%2 == 0}
			a := newLock(t, dial(t, srv.Addr()), cfg)
			mustLock(t, a)
			cb := dial(t, srv.Addr())
			b := newLock(t, cb, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errs := make(chan error, 3)
			go func() { errs <- b.Lock(ctx) }()
			waitFor(t, "b to wait", func() bool { return srv.Watching(cb.ID(), key) })
			go func() { errs <- b.Lock(ctx) }()
			go func() { _, err := b.TryLock(ctx); errs <- err }()
			time.Sleep(time.Duration(i%5) * time.Millisecond) // jitter, not a wait
			cancelled := i%4 == 1
			if cancelled {
				go cancel()
			}
			if err := b.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			for range 3 {
				select {
				case err := <-errs:
					if !errors.Is(err, lock.ErrClosed) && !(cancelled && errors.Is(err, context.Canceled)) {
						t.Errorf("call returned %v; want ErrClosed", err)
					}
				case <-time.After(waitTimeout):
					t.Fatal("a call did not return after Close")
				}
			}
		})
	}
}
