package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// rwCapped is the configuration of a participant whose holdings are capped
// at maxHold while they renew every 100 ms; renewals counts those that
// succeeded.
func rwCapped(maxHold time.Duration, renewals *atomic.Int64) lock.RWMutexConfig {
	return lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 5 * time.Second, RenewInterval: 100 * time.Millisecond,
		RenewDeadline: 3 * time.Second, MaxHold: maxHold,
		OnRenewal: func(_ time.Duration, err error) {
			if err == nil {
				renewals.Add(1)
			}
		}}
}

// awaitCap waits for m's holding to end and checks that it ended at its
// cap, as lost with ErrMaxHold, while renewing, no sooner than maxHold
// after since.
func awaitCap(t *testing.T, what string, m *lock.RWMutex, since time.Time, maxHold time.Duration, renewals *atomic.Int64) {
	t.Helper()
	select {
	case <-m.Done():
	case <-time.After(waitTimeout):
		t.Fatalf("the %s holding outlived MaxHold", what)
	}
	if held := time.Since(since); held < maxHold {
		t.Fatalf("the %s holding ended after %v, before MaxHold %v", what, held, maxHold)
	}
	if err := m.Err(); !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrMaxHold) {
		t.Fatalf("%s holding: Err = %v; want ErrLost and ErrMaxHold", what, err)
	}
	if !errors.Is(context.Cause(m.Context()), lock.ErrMaxHold) {
		t.Fatalf("%s holding: context cause = %v; want ErrMaxHold", what, context.Cause(m.Context()))
	}
	if renewals.Load() == 0 {
		t.Fatalf("%s holding: no renewal succeeded before MaxHold: the test does not show a cap on a renewing holding", what)
	}
}

// A read holding ends at MaxHold while it renews; it keeps its slot until
// RUnlock (the work has returned), and a waiting writer then gets in.
func TestRWMutexMaxHoldRead(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const maxHold = 700 * time.Millisecond
	var renewals atomic.Int64
	r := newRW(t, dial(t, srv.Addr()), rwCapped(maxHold, &renewals))
	w := newRW(t, dial(t, srv.Addr()), lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 5 * time.Second})
	start := time.Now()
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() { wrote <- w.Lock(ctx) }()
	awaitCap(t, "read", r, start, maxHold, &renewals)
	select {
	case err := <-wrote:
		t.Fatalf("a writer got in (%v) while the capped reader's work had not returned", err)
	default:
	}
	if err := r.RUnlock(ctx); err != nil {
		t.Fatalf("RUnlock after the cap = %v", err)
	}
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("writer's Lock = %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the writer did not get in after the capped reader's RUnlock")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The next read holding gets a cap of its own.
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Err(); err != nil {
		t.Fatalf("Err of the new read holding = %v", err)
	}
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A write holding ends at MaxHold while it renews, counted from the end of
// its wait for the readers, not from when it took the gate; it keeps the
// gate until Unlock, and a waiting reader then gets in.
func TestRWMutexMaxHoldWrite(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const maxHold = 700 * time.Millisecond
	var renewals atomic.Int64
	w := newRW(t, dial(t, srv.Addr()), rwCapped(maxHold, &renewals))
	r := newRW(t, dial(t, srv.Addr()), lock.RWMutexConfig{Name: "m", MaxReaders: 4, TTL: 5 * time.Second})

	// A reader holds: the writer takes the gate and waits for it for
	// longer than MaxHold.
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() { locked <- w.Lock(ctx) }()
	select {
	case err := <-locked:
		t.Fatalf("the writer got in (%v) while a reader held", err)
	case <-time.After(maxHold + 300*time.Millisecond):
	}
	released := time.Now()
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-locked:
		if err != nil {
			t.Fatalf("writer's Lock = %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the writer did not get in after the reader left")
	}
	if !w.Writing() {
		t.Fatal("Writing = false after Lock")
	}

	rd := make(chan error, 1)
	go func() { rd <- r.RLock(ctx) }()
	awaitCap(t, "write", w, released, maxHold, &renewals)
	select {
	case err := <-rd:
		t.Fatalf("a reader got in (%v) while the capped writer's work had not returned", err)
	default:
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the cap = %v", err)
	}
	select {
	case err := <-rd:
		if err != nil {
			t.Fatalf("reader's RLock = %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the reader did not get in after the capped writer's Unlock")
	}
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRWMutexMaxHoldNegativeIsAConfigError(t *testing.T) {
	srv := startStore(t)
	_, err := lock.NewRWMutex(dial(t, srv.Addr()), lock.RWMutexConfig{Name: "m", MaxHold: -time.Second})
	if !errors.Is(err, lock.ErrConfig) {
		t.Fatalf("NewRWMutex with a negative MaxHold = %v; want ErrConfig", err)
	}
}
