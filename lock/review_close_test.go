package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// Close ends an acquisition in progress: RLock or Lock should then fail
// with ErrClosed, as a Lock's and a Semaphore's do. An RWMutex entering
// (holding the gate, waiting for a slot or for a reader to leave) finds its
// gate released by Close, takes that for a lost gate, and returns
// wrap(op, err) with err nil ("%!w(<nil>)", not ErrClosed) for a reader,
// and with context.Canceled for a writer.
func TestReviewRWMutexCloseWhileEntering(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 1, TTL: time.Second}
	a := newRW(t, dial(t, srv.Addr()), cfg)
	if err := a.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, write := range []bool{false, true} {
		c := dial(t, srv.Addr())
		m := newRW(t, c, cfg)
		got := make(chan error, 1)
		go func() {
			if write {
				got <- m.Lock(ctx)
			} else {
				got <- m.RLock(ctx)
			}
		}()
		waitFor(t, "the participant to hold the gate and watch the slot", func() bool {
			return srv.Watching(c.ID(), lock.RWMutexReader("m", 0))
		})
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-got; !errors.Is(err, lock.ErrClosed) {
			t.Errorf("write %v: acquisition ended by Close = %v; want ErrClosed", write, err)
		}
	}
}
