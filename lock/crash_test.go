package lock_test

import (
	"context"
	"fmt"
	"github.com/dsslock/dsslock/internal/storetest"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// crashQueue is a lock whose holder crashed with a queue behind it.
type crashQueue struct {
	name    string
	waiters []*lock.Lock   // in queue order, behind the crashed holder
	clients []*sskv.Client // the waiters'
	got     chan acquired  // the waiters' acquisitions
	expired <-chan sskv.Event
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closers []func()
}

type acquired struct {
	i  int // index in waiters
	at time.Time
}

// newCrashQueue sets up the lock name, with TTL ttl, held by a Lock that
// waited for it (so that it keeps the queue) with n >= 3 waiters queued
// behind it in a known order, after two handovers: a queue as it is in
// use, where the first waiter need not watch the key. The first left of
// them give up. Then the holder's client goes away, half a TTL later (it
// crashes: no release, no renewal), and the key expires a TTL after its
// last renewal.
//
// With a short TTL on a loaded machine a watcher may take the key before a
// turn that is merely slow, and the queue is not as planned: then the error
// says so, and cq is closed.
func newCrashQueue(tb testing.TB, srv *localstore.Server, name string, ttl time.Duration, n, left int) (*crashQueue, error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cq := &crashQueue{name: name, got: make(chan acquired, n+2), cancel: cancel}
	if err := cq.setUp(tb, ctx, srv, ttl, n, left); err != nil {
		cq.close()
		return nil, err
	}
	return cq, nil
}

func (cq *crashQueue) setUp(tb testing.TB, ctx context.Context, srv *localstore.Server, ttl time.Duration, n, left int) error {
	name := cq.name
	observer := dial(tb, srv.Addr())
	cq.closers = append(cq.closers, func() { _ = observer.Close() })
	newL := func() (*lock.Lock, *sskv.Client) {
		c := dial(tb, srv.Addr())
		l, err := lock.New(c, lock.Config{Name: name, TTL: ttl})
		if err != nil {
			tb.Fatal(err)
		}
		cq.closers = append(cq.closers, func() { _ = l.Close(context.Background()); _ = c.Close() })
		return l, c
	}
	inbox := func(l *lock.Lock) *sskv.Watcher {
		w, err := observer.Watch(ctx, name+"\x00inbox\x00"+l.HolderID())
		if err != nil {
			tb.Fatal(err)
		}
		storetest.SkipInitial(tb, w)
		return w
	}
	// The holder keeps a queue: it waited for the lock.
	first, _ := newL()
	if err := first.Lock(ctx); err != nil {
		return err
	}
	h, hc := newL()
	held := make(chan error, 1)
	go func() { held <- h.Lock(ctx) }()
	if err := poll("the holder to wait", func() bool { return srv.Watching(hc.ID(), name+"\x00inbox\x00"+h.HolderID()) }); err != nil {
		return err
	}
	if err := first.Unlock(ctx); err != nil {
		return err
	}
	if err := <-held; err != nil {
		return err
	}
	// n+2 waiters, one at a time, so that the queue is in their order: the
	// holder answers each join (a SET of the waiter's inbox).
	ws := make([]*lock.Lock, n+2)
	cs := make([]*sskv.Client, n+2)
	got := make(chan acquired, n+2)
	cq.closers = append(cq.closers, func() { close(got) })
	giveUp := make([]context.CancelFunc, n+2)
	for i := range ws {
		ws[i], cs[i] = newL()
		told := inbox(ws[i])
		wctx, cancel := context.WithCancel(ctx)
		giveUp[i] = cancel
		cq.wg.Go(func() {
			defer cancel()
			if err := ws[i].Lock(wctx); err != nil {
				if wctx.Err() == nil {
					tb.Errorf("waiter %d: %v", i, err)
				}
				return
			}
			got <- acquired{i, time.Now()}
		})
		select {
		case <-told.Events():
		case <-time.After(waitTimeout):
			return fmt.Errorf("the holder did not answer waiter %d's join", i)
		}
		told.Stop()
	}
	// Two handovers: to the first waiter, then to the second, which is
	// the holder that crashes.
	next := func(want int) error {
		select {
		case a := <-got:
			if a.i != want {
				return fmt.Errorf("waiter %d acquired; want waiter %d, the first in the queue", a.i, want)
			}
		case <-time.After(waitTimeout):
			return fmt.Errorf("waiter %d did not acquire", want)
		}
		return nil
	}
	if err := h.Unlock(ctx); err != nil {
		return err
	}
	if err := next(0); err != nil {
		return err
	}
	if err := ws[0].Unlock(ctx); err != nil {
		return err
	}
	if err := next(1); err != nil {
		return err
	}
	cq.waiters, cq.clients = ws[2:], cs[2:]
	// The crash: with two of the n waiters watching the key.
	if err := poll("two waiters to watch the key", func() bool {
		watching := 0
		for _, c := range cq.clients {
			if srv.Watching(c.ID(), name) {
				watching++
			}
		}
		return watching == 2
	}); err != nil {
		return err
	}
	kw, err := observer.Watch(ctx, name)
	if err != nil {
		return err
	}
	storetest.SkipInitial(tb, kw)
	cq.expired = kw.Events()
	for _, cancel := range giveUp[2 : 2+left] {
		cancel()
	}
	// The holder renews a few times first, as a holder usually has since
	// its watchers started watching: a watcher tells an expiry from a
	// release by the time since the last write it saw (see qcore.onKey).
	time.Sleep(ttl / 2)
	_ = cs[1].Close()
	// Acquisitions by the n waiters behind it, reindexed.
	go func() {
		for a := range got {
			a.i -= 2
			cq.got <- a
		}
	}()
	return nil
}

// poll waits for cond, as waitFor does, and says so if it timed out.
func poll(what string, cond func() bool) error {
	for deadline := time.Now().Add(waitTimeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out waiting for %s", what)
		}
	}
	return nil
}

// takeover waits for the key to expire and for a waiter to take it, and
// returns which, and how long after the expiry (as the observer saw it).
func (cq *crashQueue) takeover(tb testing.TB) (int, time.Duration) {
	tb.Helper()
	deadline := time.After(waitTimeout)
	var expiredAt time.Time
	for expiredAt.IsZero() {
		select {
		case ev := <-cq.expired:
			if ev.Op == sskv.OpDelete {
				expiredAt = time.Now()
			}
		case <-deadline:
			tb.Fatal("the crashed holder's key did not expire")
		}
	}
	select {
	case a := <-cq.got:
		return a.i, a.at.Sub(expiredAt)
	case <-deadline:
		tb.Fatal("no waiter took the crashed holder's key")
	}
	return -1, 0
}

// close ends the waits and closes every Lock and client.
func (cq *crashQueue) close() {
	cq.cancel()
	for _, l := range cq.waiters {
		_ = l.Close(context.Background())
	}
	cq.wg.Wait()
	for i := len(cq.closers) - 1; i >= 0; i-- {
		cq.closers[i]()
	}
}

// A holder that crashes with waiters queued behind it, the first of which
// does not watch the key (the watchers come from the back of the queue):
// a watcher sees the key expire and tells the first waiter, which takes
// the key at once, rather than a watcher after coverGrace (TTL/10).
func TestCrashTakeoverGoesToFirstWaiter(t *testing.T) {
	srv := startStore(t)
	const n = 4
	// coverGrace is 300 ms: well clear of a message and an acquisition,
	// even on a loaded machine with the race detector.
	const ttl = 3 * time.Second
	cq, err := newCrashQueue(t, srv, "c", ttl, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.close()
	if srv.Watching(cq.clients[0].ID(), "c") {
		t.Log("the first waiter watches the key: the test does not cover what it is for")
	}
	i, after := cq.takeover(t)
	if i != 0 {
		t.Fatalf("waiter %d of %d took the crashed holder's key %v after it expired; want the first", i, n, after)
	}
	if h := holder(t, cq.waiters[0]); h.ID != cq.waiters[0].HolderID() {
		t.Fatalf("Holder = %+v; want the first waiter", h)
	}
	// The others join it again (the roll call), and are served in turn.
	for range n - 1 {
		if err := cq.waiters[i].Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		select {
		case a := <-cq.got:
			i = a.i
		case <-time.After(waitTimeout):
			t.Fatal("a waiter left behind after the takeover did not acquire")
		}
	}
	t.Logf("the first of %d waiters took the key %v after it expired", n, after)
}

// A holder that crashes with waiters queued behind it, the first of which
// gave up before: the holder told the watchers of the key, so they tell the
// next waiter, now the first, which takes the key at once.
func TestCrashTakeoverSkipsWaiterThatLeft(t *testing.T) {
	srv := startStore(t)
	// Five, so that the second does not watch the key either. The first
	// leaves 1.5 s before the crash: its queue, which it keeps for a TTL
	// after, has ended by the expiry, and with it its inbox.
	const n = 5
	const ttl = 3 * time.Second // coverGrace 300 ms, as above
	cq, err := newCrashQueue(t, srv, "c", ttl, n, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.close()
	i, after := cq.takeover(t)
	if i != 1 {
		t.Fatalf("waiter %d of %d took the crashed holder's key %v after it expired; want the second, the first left", i, n, after)
	}
	t.Logf("the second of %d waiters, the first having left, took the key %v after it expired", n, after)
}

// Crash takeover with a queue: the holder crashes with n waiters behind it,
// after two handovers (see newCrashQueue); measured from the key's expiry,
// as an observer's watch saw it, to the first waiter's Lock returning.
// Reports also how often another than the first waiter took the key, and
// how often the queue was not as planned (a watcher took the key before a
// slow turn: see newCrashQueue), which is set up again.
func BenchmarkCrashTakeoverQueue(b *testing.B) {
	for _, n := range []int{3, 10} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			srv := startStore(b)
			const ttl = 200 * time.Millisecond
			var ds []time.Duration
			notFirst, k, again := 0, 0, 0
			for b.Loop() {
				var cq *crashQueue
				for {
					k++
					var err error
					if cq, err = newCrashQueue(b, srv, fmt.Sprintf("c%d", k), ttl, n, 0); err == nil {
						break
					}
					b.Logf("setting up again: %v", err)
					if again++; again > 10+b.N/2 {
						b.Fatal("the queue was not as planned too often")
					}
				}
				i, d := cq.takeover(b)
				if i != 0 {
					notFirst++
				}
				ds = append(ds, d)
				cq.close()
			}
			reportPercentiles(b, ds, "ms-after-expiry")
			b.ReportMetric(float64(notFirst)/float64(len(ds)), "not-first/op")
			b.ReportMetric(float64(again)/float64(len(ds)), "set-up-again/op")
		})
	}
}
