package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestEndDoesNotWaitForLostStop: when a FenceKey holding ends, the watch of
// its key is ended in the background, whether or not it was set up yet. A
// lost answer to that KEYNOTIFY STOP used to hold Unlock (and a leader's
// Resign, and Elector.Run) for the client's RequestTimeout; the fault
// harness found it.
func TestEndDoesNotWaitForLostStop(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: testID(t), RequestTimeout: time.Minute,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	other := dial(t, srv.Addr())
	l := newLock(t, c, lock.Config{Name: "l", TTL: time.Second, FenceKey: true})
	mustLock(t, l)
	waitFor(t, "the holder watches its key", func() bool { return srv.Watching(c.ID(), "l") })

	// Delete the key behind the holder's back: its guard ends the holding
	// and its watch, and the answer to the STOP is lost.
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{Drop: true})
	if _, err := other.Del(ctx, "l", sskv.DelOptions{FencingToken: l.Token()}); err != nil {
		t.Fatalf("Del: %v", err)
	}
	waitDone(t, l)
	waitFor(t, "the store ends the holder's watch", func() bool { return !srv.Watching(c.ID(), "l") })
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{})

	uctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err = l.Unlock(uctx)
	took := time.Since(start)
	t.Logf("Unlock after the lost STOP: %v in %v", err, took)
	if errors.Is(err, context.DeadlineExceeded) || took > 15*time.Second {
		t.Fatalf("Unlock took %v (%v): it waited for the lost answer to KEYNOTIFY STOP", took, err)
	}
}
