package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// A store that is gone (shut down, or closed by a test before the locks'
// cleanups run) does not hold up Unlock: it returns at once, says the key
// was not released, and the holding has ended all the same.
func TestUnlockWithStoreGone(t *testing.T) {
	for _, fenceKey := range []bool{false, true} {
		srv := startStore(t)
		c := dial(t, srv.Addr())
		l := newLock(t, c, lock.Config{Name: "l", TTL: 10 * time.Second, FenceKey: fenceKey})
		mustLock(t, l)
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := l.Unlock(context.Background())
		took := time.Since(start)
		if !errors.Is(err, lock.ErrNotReleased) {
			t.Errorf("FenceKey %v: Unlock = %v; want ErrNotReleased", fenceKey, err)
		}
		// Before, it waited for the client's request timeout (10 s).
		if took > 5*time.Second {
			t.Errorf("FenceKey %v: Unlock took %v with the store gone", fenceKey, took)
		}
		if !errors.Is(l.Err(), lock.ErrReleased) {
			t.Errorf("FenceKey %v: after Unlock, Err = %v; want ErrReleased", fenceKey, l.Err())
		}
		if err := l.Unlock(context.Background()); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("FenceKey %v: second Unlock = %v; want ErrNotHeld", fenceKey, err)
		}
	}
}

// Unlock after a reconnect deletes the key on the new connection.
func TestUnlockAfterReconnect(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	l := newLock(t, c, lock.Config{Name: "l", TTL: 10 * time.Second})
	mustLock(t, l)
	cn, err := c.Connection(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	<-cn.Done()
	if _, err := c.Connection(testCtx(t)); err != nil { // reconnected
		t.Fatal(err)
	}
	if err := l.Unlock(testCtx(t)); err != nil {
		t.Fatalf("Unlock after a reconnect: %v", err)
	}
	if h := holder(t, l); h.Held() {
		t.Fatalf("after Unlock, the key holds %+v", h)
	}
}
