package harness_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestTryLockAfterReconnectDoesNotWaitOutALostAnswer forces what the group
// schedules of seeds 1003, 1011, 7023, 7055, 7083 and 7163 failed on: a
// leader.Group member that lost its slot joins again with lock.TryLock on
// a free slot; within a TTL of its client's reconnect TryLock takes
// nothing and reads the key (to tell a lock from a key that is none), and
// that read's answer is lost. The read is bounded only by the client's
// RequestTimeout (10 s): the member stays out of the group, and the shares
// uneven, for 10 s (goroutines: groupRun.join, Lock.TryLock, checkKey,
// readKey, Client.Get). An acquisition waits no longer than the renew
// deadline for a lost answer (seed 1084); nor should TryLock's read.
func TestTryLockAfterReconnectDoesNotWaitOutALostAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a store")
	}
	t.Parallel()
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	srv := s.store()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "rejoin-member"
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The client reconnects; a read succeeds once it has.
	if err := srv.Kick(id); err != nil {
		t.Fatal(err)
	}
	for _, err = c.Get(ctx, "k"); err != nil; _, err = c.Get(ctx, "k") {
		if !errors.Is(err, sskv.ErrConnectionLost) && !errors.Is(err, sskv.ErrNotSent) {
			t.Logf("read while reconnecting: %v", err)
		}
	}
	srv.SetResponseFault(id, localstore.ResponseFault{Drop: true})
	defer srv.SetResponseFault(id, localstore.ResponseFault{})
	l, err := lock.New(c, lock.Config{Name: "k", HolderID: id, TTL: ttl, RenewInterval: renewInterval, RenewDeadline: renewDeadline, Race: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = l.Close(cctx)
	}()
	// No deadline, as in Group.Run: the client's RequestTimeout bounds the
	// read (cancelled after 20 s, in case it does not).
	tctx, tcancel := context.WithCancel(context.Background())
	defer time.AfterFunc(20*time.Second, tcancel).Stop()
	defer tcancel()
	start := time.Now()
	ok, err := l.TryLock(tctx)
	took := time.Since(start)
	t.Logf("TryLock: %v, %v, after %v", ok, err, took.Round(time.Millisecond))
	// The renew deadline, and much time for a loaded machine.
	if limit := renewDeadline + 2*time.Second; took > limit {
		t.Errorf("TryLock waited %v for a lost answer (more than %v): a Group member rejoining waits as long", took.Round(time.Millisecond), limit)
	}
}

// TestTryAcquireDoesNotWaitOutALostAnswer: the semaphore schedule of seed
// 7002 had a participant out for over 8.6 s after the healing, its Acquire
// in Semaphore.prepare reading the semaphore's record (readLimit,
// Client.Get) whose answer was lost, bounded only by the client's
// RequestTimeout (10 s). TryAcquire reads the record the same way.
func TestTryAcquireDoesNotWaitOutALostAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a store")
	}
	t.Parallel()
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	srv := s.store()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "participant"
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sem, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: semaphoreName, Limit: semLimit, HolderID: id,
		TTL: ttl, RenewInterval: renewInterval, RenewDeadline: renewDeadline})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = sem.Close(cctx)
	}()
	srv.SetResponseFault(id, localstore.ResponseFault{Drop: true})
	defer srv.SetResponseFault(id, localstore.ResponseFault{})
	tctx, tcancel := context.WithCancel(context.Background())
	defer time.AfterFunc(20*time.Second, tcancel).Stop()
	defer tcancel()
	start := time.Now()
	ok, err := sem.TryAcquire(tctx)
	took := time.Since(start)
	t.Logf("TryAcquire: %v, %v, after %v", ok, err, took.Round(time.Millisecond))
	// A renew deadline for the record and for each slot, and much time
	// for a loaded machine.
	if limit := (semLimit+1)*renewDeadline + 2*time.Second; took > limit {
		t.Errorf("TryAcquire waited %v for lost answers (more than %v): an Acquire waits as long", took.Round(time.Millisecond), limit)
	}
}

// TestWatchAfterReconnectDoesNotWaitOutALostAnswer: the semaphore schedule
// of seed 7130 (and its first replay) had a waiter deaf for 10 s after a
// reconnect: the client registers its watches again (KEYNOTIFY), those
// answers were lost, and it waits the client's RequestTimeout (10 s,
// sskv/watchregistry.go) before it tries again ("watch re-registration
// failed; retrying"). Meanwhile the waiter's inbox, queue and key watches
// deliver nothing, and it misses its turns (the others held the semaphore
// hundreds of times). Here: a watch, its client's connection kicked while
// the store drops that client's answers, the drop lifted once the client
// is back, and the key set: the watch must deliver the change soon.
func TestWatchAfterReconnectDoesNotWaitOutALostAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a store")
	}
	t.Parallel()
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	srv := s.store()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "watcher"
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "writer"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	<-w.Events() // Initial
	srv.SetResponseFault(id, localstore.ResponseFault{Drop: true})
	if err := srv.Kick(id); err != nil {
		t.Fatal(err)
	}
	// Back, with its registration sent and its answer dropped.
	tick := time.NewTicker(5 * time.Millisecond)
	for !srv.Connected(id) {
		<-tick.C
	}
	tick.Stop()
	srv.SetResponseFault(id, localstore.ResponseFault{})
	start := time.Now()
	if _, err := other.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	// Twice PingTimeout (1 s) for the lost attempt, then one that
	// succeeds: well short of RequestTimeout (10 s).
	limit := 4 * time.Second
	select {
	case ev := <-w.Events():
		t.Logf("event %+v after %v", ev, time.Since(start).Round(time.Millisecond))
	case <-time.After(limit):
		t.Errorf("no event within %v of the change: the watch waits out its lost registration", limit)
		select {
		case ev := <-w.Events():
			t.Logf("event %+v after %v", ev, time.Since(start).Round(time.Millisecond))
		case <-time.After(15 * time.Second):
			t.Logf("no event within %v", 15*time.Second+limit)
		}
	}
}
