package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

// RWMutex participants sharing a client read and write at random: the
// slots' and the gate's watches join each other's registrations on that
// client (a watch's first event is then the registration's latest known
// state, which may lag the client's own writes). Never a writer with
// anyone else; no holding lost (nothing failed).
func TestReviewRWMutexSharedClientExclusion(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: 2 * time.Second}
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	var readers, writers, lost atomic.Int32
	const participants, rounds = 6, 15
	errs := make(chan error, participants)
	for i := range participants {
		c := ca
		if i >= 4 {
			c = cb
		}
		m := newRW(t, c, cfg)
		go func() { errs <- rwRounds(ctx, m, rounds, &readers, &writers, &lost) }()
	}
	for range participants {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := lost.Load(); n > 0 {
		t.Errorf("%d holdings lost with no fault", n)
	}
}

func rwRounds(ctx context.Context, m *lock.RWMutex, rounds int, readers, writers, lost *atomic.Int32) error {
	for range rounds {
		write := rand.N(3) == 0
		if write {
			if err := m.Lock(ctx); err != nil {
				return err
			}
			if w, r := writers.Add(1), readers.Load(); w != 1 || r != 0 {
				return fmt.Errorf("a writer with %d writers and %d readers", w, r)
			}
		} else {
			if err := m.RLock(ctx); err != nil {
				return err
			}
			readers.Add(1)
			if w := writers.Load(); w != 0 {
				return fmt.Errorf("a reader with %d writers", w)
			}
		}
		time.Sleep(time.Duration(1+rand.N(5)) * time.Millisecond) // the guarded work
		if m.Err() != nil {
			lost.Add(1)
		}
		var err error
		if write {
			writers.Add(-1)
			err = m.Unlock(ctx)
		} else {
			readers.Add(-1)
			err = m.RUnlock(ctx)
		}
		// A release cut off by a kick is reported, and the key expires
		// within its TTL: what the callers here check is exclusion and
		// progress, not that.
		if err != nil && !errors.Is(err, lock.ErrNotReleased) {
			return err
		}
	}
	return nil
}

// One client (4 participants) is kicked every 0.3 to 0.7 s, more often
// than the TTL (1 s): it reconnects again and again and is held off nearly
// all the while. Its own participants may starve meanwhile (they take
// nothing free within a hold-off), but the 2 participants of the other
// client, which has no outage, should get their turns. Three stalls were
// seen, each fixed: a reader of the kicked client held the gate waiting
// for a slot it may not take within its hold-off (it now leaves the gate,
// as a Semaphore's gate holder does); a writer of the kicked client held
// the gate draining a slot its reader had released (it now leaves the gate
// too); and the gate's queue: a held-off waiter kept the turn, or was the
// only one to see the gate free (docs/design/queue.md, W18, W21, W22).
func TestReviewRWMutexFlappingClientStallsOthers(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: time.Second}
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	var readers, writers, lost atomic.Int32
	const rounds = 30
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	aerrs, berrs := make(chan error, 4), make(chan error, 2)
	for range 4 {
		m := newRW(t, ca, cfg)
		go func() { aerrs <- rwRounds(ctx, m, rounds, &readers, &writers, &lost) }()
	}
	for range 2 {
		m := newRW(t, cb, cfg)
		go func() { berrs <- rwRounds(bctx, m, rounds, &readers, &writers, &lost) }()
	}
	stop := make(chan struct{})
	kicked := make(chan struct{})
	go func() {
		defer close(kicked)
		for {
			_ = srv.Kick(ca.ID())
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(300+rand.N(400)) * time.Millisecond): // the fault schedule
			}
		}
	}()
	start := time.Now()
	for range 2 {
		if err := <-berrs; err != nil {
			t.Errorf("a participant on the client without outages, after %v: %v", time.Since(start).Round(time.Millisecond), err)
			for _, k := range []string{lock.RWMutexGate("m"), lock.RWMutexReader("m", 0), lock.RWMutexReader("m", 1)} {
				res, err := cb.Get(ctx, k)
				t.Logf("%q: found %v, %q, %v", k, res.Found, res.Value, err)
			}
			t.Logf("the kicked client is %s, the other %s", ca.ID(), cb.ID())
		}
	}
	close(stop)
	<-kicked
	for range 4 {
		if err := <-aerrs; err != nil {
			t.Errorf("a participant on the kicked client, once the kicks stopped: %v", err)
		}
	}
	t.Logf("%d holdings lost", lost.Load())
}

// The same for a Semaphore (limit 1): the participants of the client
// without outages get their turns while the other client keeps
// reconnecting, and never two holders. It failed about 1 run in 6 until
// the queue's simulation traced why: waiters of the kicked client, held
// off, kept the gate's turn, or were the only ones to see it free, and a
// turn lost with their outage left the others asleep (docs/design/
// queue.md, W18, W21, W22).
func TestReviewSemaphoreFlappingClientOthersGoOn(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: time.Second}
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	var holders, acquired atomic.Int32
	rounds := func(ctx context.Context, s *lock.Semaphore, n int) error {
		for range n {
			if err := s.Acquire(ctx); err != nil {
				return err
			}
			acquired.Add(1)
			if h := holders.Add(1); h != 1 {
				return fmt.Errorf("%d holders of a semaphore of 1", h)
			}
			time.Sleep(time.Duration(1+rand.N(5)) * time.Millisecond) // the guarded work
			holders.Add(-1)
			if err := s.Release(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	aerrs, berrs := make(chan error, 4), make(chan error, 2)
	for range 4 {
		s := newSemaphore(t, ca, cfg)
		go func() { aerrs <- rounds(ctx, s, 15) }()
	}
	for range 2 {
		s := newSemaphore(t, cb, cfg)
		go func() { berrs <- rounds(bctx, s, 15) }()
	}
	stop, kicked := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(kicked)
		for {
			_ = srv.Kick(ca.ID())
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(300+rand.N(400)) * time.Millisecond): // the fault schedule
			}
		}
	}()
	start := time.Now()
	for range 2 {
		if err := <-berrs; err != nil {
			t.Errorf("a participant on the client without outages, after %v: %v", time.Since(start).Round(time.Millisecond), err)
			for _, k := range []string{"s\x00gate", lock.SemaphoreSlot("s", 0)} {
				res, err := cb.Get(ctx, k)
				t.Logf("%q: found %v, %q, %v", k, res.Found, res.Value, err)
			}
			t.Logf("the kicked client is %s, the other %s; %d acquisitions in all", ca.ID(), cb.ID(), acquired.Load())
		}
	}
	close(stop)
	<-kicked
	for range 4 {
		if err := <-aerrs; err != nil {
			t.Errorf("a participant on the kicked client, once the kicks stopped: %v", err)
		}
	}
}
