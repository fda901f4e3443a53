package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// endedCtx is a context that has ended, as a service's is when it shuts
// down and releases what it holds.
func endedCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// Lock.Unlock with ctx done "still tries, for at most a second", and
// Lock.begin takes a free turn whatever ctx says. Semaphore.begin and
// RWMutex.begin select between the free turn and ctx.Done(): with ctx
// ended, Go picks either at random, and about half the time Release,
// RUnlock and Unlock return ctx's error having tried nothing. The holding
// then goes on, renewed by the renewer, until the process ends: the slot
// (or the write lock) is never given back.
func TestReviewSemaphoreReleaseWithEndedCtx(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	s := newSemaphore(t, dial(t, srv.Addr()), lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: time.Second})
	for i := range 20 {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(endedCtx()); err != nil || !errors.Is(s.Err(), lock.ErrReleased) {
			t.Fatalf("try %d: Semaphore.Release(ended ctx) = %v; the holding: %v (want released)", i, err, s.Err())
		}
	}
}

// The same for RWMutex.RUnlock and Unlock.
func TestReviewRWMutexReleaseWithEndedCtx(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	m := newRW(t, dial(t, srv.Addr()), lock.RWMutexConfig{Name: "m", MaxReaders: 1, TTL: time.Second})
	for i := range 20 {
		if err := m.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.RUnlock(endedCtx()); err != nil || !errors.Is(m.Err(), lock.ErrReleased) {
			t.Fatalf("try %d: RWMutex.RUnlock(ended ctx) = %v; the holding: %v (want released)", i, err, m.Err())
		}
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(endedCtx()); err != nil || !errors.Is(m.Err(), lock.ErrReleased) {
			t.Fatalf("try %d: RWMutex.Unlock(ended ctx) = %v; the holding: %v (want released)", i, err, m.Err())
		}
	}
}

// Semaphore.Close with an ended ctx (a shutdown) at random returns ctx's
// error without releasing the slot held or marking the participant closed:
// the slot stays held, renewed, until the process ends.
func TestReviewSemaphoreCloseWithEndedCtx(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	for i := range 20 {
		s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		cerr := s.Close(endedCtx())
		if s.Err() == nil {
			_ = s.Close(context.Background())
			t.Fatalf("try %d: Close(ended ctx) = %v, and the slot is still held", i, cerr)
		}
	}
}
