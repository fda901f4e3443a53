package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A holding that reaches MaxHold ends as lost with ErrMaxHold while its
// renewals succeed; the key stays until Unlock, after the work returned,
// deletes it.
func TestMaxHoldEndsHoldingWhileRenewing(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	var renewals atomic.Int64
	const maxHold = 700 * time.Millisecond
	l := newLock(t, c, lock.Config{Name: "l", TTL: 5 * time.Second, RenewInterval: 100 * time.Millisecond,
		RenewDeadline: 3 * time.Second, MaxHold: maxHold,
		OnRenewal: func(_ time.Duration, err error) {
			if err == nil {
				renewals.Add(1)
			}
		}})
	start := time.Now()
	if ok, err := l.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(waitTimeout):
		t.Fatal("the holding outlived MaxHold")
	}
	held := time.Since(start)
	if held < maxHold {
		t.Fatalf("the holding ended after %v, before MaxHold %v", held, maxHold)
	}
	if err := l.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrMaxHold) {
		t.Fatalf("Err = %v; want ErrLost and ErrMaxHold", err)
	}
	if !errors.Is(context.Cause(l.Context()), lock.ErrMaxHold) {
		t.Fatalf("context cause = %v; want ErrMaxHold", context.Cause(l.Context()))
	}
	if renewals.Load() == 0 {
		t.Fatal("no renewal succeeded before MaxHold: the test does not show a cap on a renewing holding")
	}
	// The work has not returned yet: the key is still the holder's.
	if res, err := c.Get(ctx, "l"); err != nil || !res.Found {
		t.Fatalf("Get after the cap = %+v, %v; want the key still there until Unlock", res, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the cap = %v", err)
	}
	if res, err := c.Get(ctx, "l"); err != nil || res.Found {
		t.Fatalf("Get after Unlock = %+v, %v; want the key deleted", res, err)
	}
	// The next holding gets a cap of its own.
	if ok, err := l.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock again = %v, %v", ok, err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("Err of the new holding = %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMaxHoldNegativeIsAConfigError(t *testing.T) {
	srv := startStore(t)
	_, err := lock.New(dial(t, srv.Addr()), lock.Config{Name: "l", MaxHold: -time.Second})
	if !errors.Is(err, lock.ErrConfig) {
		t.Fatalf("New with a negative MaxHold = %v; want ErrConfig", err)
	}
}

// Unlock and Close with a context that has ended already still delete the
// key, at once: the key does not stay for a TTL.
func TestReleaseWithEndedContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(*lock.Lock, context.Context) error
	}{
		{"Unlock", (*lock.Lock).Unlock},
		{"Close", (*lock.Lock).Close},
	} {
		for _, fence := range []bool{false, true} {
			t.Run(tc.name+map[bool]string{false: "", true: "/FenceKey"}[fence], func(t *testing.T) {
				srv := startStore(t)
				ctx := testCtx(t)
				c := dial(t, srv.Addr())
				l := newLock(t, c, lock.Config{Name: "l", TTL: time.Minute, FenceKey: fence})
				if ok, err := l.TryLock(ctx); !ok || err != nil {
					t.Fatalf("TryLock = %v, %v", ok, err)
				}
				ended, cancel := context.WithCancel(ctx)
				cancel()
				start := time.Now()
				if err := tc.release(l, ended); err != nil {
					t.Fatalf("%s with an ended context = %v; want nil", tc.name, err)
				}
				t.Logf("%s with an ended context took %v", tc.name, time.Since(start))
				if res, err := c.Get(ctx, "l"); err != nil || res.Found {
					t.Fatalf("Get after %s = %+v, %v; want the key deleted", tc.name, res, err)
				}
			})
		}
	}
}

// With its context ended and the store not answering, Unlock gives up
// within its own short bound instead of blocking.
func TestUnlockWithEndedContextIsBounded(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	l := newLock(t, c, lock.Config{Name: "l", TTL: time.Minute})
	if ok, err := l.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	if err := srv.Hold(c.ID(), localstore.ToStore); err != nil {
		t.Fatal(err)
	}
	defer srv.Release(c.ID())
	ended, cancel := context.WithCancel(ctx)
	cancel()
	done := make(chan error, 1)
	go func() { done <- l.Unlock(ended) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Unlock through a held path reported the key deleted")
		}
		t.Logf("Unlock gave up: %v", err)
	case <-time.After(waitTimeout):
		t.Fatal("Unlock with an ended context blocked")
	}
}

// A Semaphore's MaxHold caps each slot's holding as it does a Lock's.
func TestSemaphoreMaxHold(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: 5 * time.Second,
		RenewInterval: 100 * time.Millisecond, RenewDeadline: 3 * time.Second, MaxHold: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(waitTimeout):
		t.Fatal("the slot's holding outlived MaxHold")
	}
	if err := s.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrMaxHold) {
		t.Fatalf("Err = %v; want ErrLost and ErrMaxHold", err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("Release after the cap = %v", err)
	}
	if res, err := c.Get(ctx, lock.SemaphoreSlot("s", s.Slot())); err != nil || res.Found {
		t.Fatalf("slot key after Release = %+v, %v; want it deleted", res, err)
	}
}
