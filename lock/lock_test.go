package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitTimeout = storetest.WaitTimeout

var (
	testID     = storetest.ID
	startStore = storetest.Start
	testCtx    = storetest.Ctx
	dial       = storetest.Dial
	waitFor    = storetest.Eventually
)

// queueKeeper returns a Lock on c that holds cfg's lock and keeps its
// queue: it waited for the lock (a Lock that takes a free lock keeps none),
// behind another Lock on srv, which has released it.
func queueKeeper(t testing.TB, srv *localstore.Server, c *sskv.Client, cfg lock.Config) *lock.Lock {
	t.Helper()
	ctx := testCtx(t)
	first := newLock(t, dial(t, srv.Addr()), cfg)
	mustLock(t, first)
	keeper := newLock(t, c, cfg)
	held := make(chan error, 1)
	go func() { held <- keeper.Lock(ctx) }()
	inbox := cfg.Name + "\x00inbox\x00" + keeper.HolderID()
	waitFor(t, "the keeper to wait", func() bool { return srv.Watching(c.ID(), inbox) })
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	return keeper
}

// queuedLock calls l.Lock in the background, and returns once the holder
// has answered its join (a message in l's inbox, which observer watches):
// l waits in the holder's queue. Lock's result comes on the channel.
func queuedLock(t testing.TB, observer *sskv.Client, l *lock.Lock) <-chan error {
	t.Helper()
	ctx := testCtx(t)
	told, err := observer.Watch(ctx, l.Name()+"\x00inbox\x00"+l.HolderID())
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, told)
	defer told.Stop()
	got := make(chan error, 1)
	go func() { got <- l.Lock(ctx) }()
	for {
		select {
		case ev, ok := <-told.Events():
			if !ok {
				t.Fatalf("the watch of %s's inbox ended: %v", l.HolderID(), told.Err())
			}
			// Not a join sent to it (as a holder): an answer.
			if ev.Op == sskv.OpSet && len(ev.Value) > 0 && ev.Value[0] != '+' && ev.Value[0] != '*' {
				return got
			}
		case <-time.After(waitTimeout):
			t.Fatalf("the holder did not answer %s's join", l.HolderID())
		}
	}
}

func newLock(t testing.TB, c *sskv.Client, cfg lock.Config) *lock.Lock {
	t.Helper()
	l, err := lock.New(c, cfg)
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func mustLock(t testing.TB, l *lock.Lock) {
	t.Helper()
	if err := l.Lock(testCtx(t)); err != nil {
		t.Fatalf("Lock: %v", err)
	}
}

func holder(t testing.TB, l *lock.Lock) lock.Holder {
	t.Helper()
	h, err := l.Holder(testCtx(t))
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	return h
}

func TestConfigValidation(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, tc := range []struct {
		cfg  lock.Config
		want string
	}{
		{lock.Config{}, "empty Name"},
		{lock.Config{Name: "l", TTL: -time.Second}, "negative"},
		{lock.Config{Name: "l", TTL: 1500 * time.Microsecond}, "TTL 1.5ms is not a positive whole number of milliseconds"},
		{lock.Config{Name: "l", TTL: time.Second, RenewDeadline: time.Second}, "RenewDeadline 1s must be less than TTL 1s"},
		{lock.Config{Name: "l", TTL: time.Second, RenewInterval: 700 * time.Millisecond}, "RenewInterval 700ms must be less than RenewDeadline 666ms"},
		// Only TTL is set: the error names it, not the RenewInterval
		// derived from it.
		{lock.Config{Name: "l", TTL: 2 * time.Millisecond}, "TTL 2ms is too short: with the default RenewInterval (TTL/3) and RenewDeadline (2/3 TTL), in whole milliseconds, it must be at least 3ms"},
		{lock.Config{Name: "l", TTL: time.Millisecond}, "TTL 1ms is too short"},
		{lock.Config{Name: "l", TTL: 2 * time.Millisecond, RenewInterval: time.Millisecond}, "RenewInterval 1ms must be less than RenewDeadline 1ms"},
	} {
		_, err := lock.New(c, tc.cfg)
		if !errors.Is(err, lock.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v; want ErrConfig mentioning %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := lock.New(nil, lock.Config{Name: "l"}); !errors.Is(err, lock.ErrConfig) {
		t.Errorf("New(nil client) = %v; want ErrConfig", err)
	}
	if _, err := lock.New(c, lock.Config{Name: "l", TTL: 3 * time.Millisecond}); err != nil {
		t.Errorf("the shortest TTL the error names: %v", err)
	}
	l, err := lock.New(c, lock.Config{Name: "l", TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := l.Config()
	if got.RenewInterval != time.Second || got.RenewDeadline != 2*time.Second || !strings.HasPrefix(got.HolderID, c.ID()+"/") {
		t.Errorf("defaults: %+v", got)
	}
}

func TestTryLockAndUnlock(t *testing.T) {
	srv := startStore(t)
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	a := newLock(t, ca, lock.Config{Name: "l"})
	b := newLock(t, cb, lock.Config{Name: "l"})
	ctx := testCtx(t)

	if !errors.Is(a.Err(), lock.ErrNotHeld) || a.Context().Err() == nil || !a.Token().IsZero() {
		t.Fatalf("before acquisition: Err %v, Context.Err %v, Token %v", a.Err(), a.Context().Err(), a.Token())
	}
	if ok, err := a.TryLock(ctx); !ok || err != nil {
		t.Fatalf("a.TryLock = %v, %v; want true", ok, err)
	}
	if a.Err() != nil || a.Context().Err() != nil {
		t.Fatalf("held, but Err %v", a.Err())
	}
	if h := holder(t, b); h.ID != a.HolderID() || h.Version.Before(a.Token()) {
		t.Fatalf("Holder = %+v; want %s at or after %v", h, a.HolderID(), a.Token())
	}
	if ok, err := b.TryLock(ctx); ok || err != nil {
		t.Fatalf("b.TryLock while a holds = %v, %v; want false, nil", ok, err)
	}
	if ok, err := a.TryLock(ctx); ok || !errors.Is(err, lock.ErrAlreadyHeld) {
		t.Fatalf("a.TryLock again = %v, %v; want ErrAlreadyHeld", ok, err)
	}
	tok, err := a.FencingToken()
	if err != nil || tok != a.Token() {
		t.Fatalf("FencingToken = %v, %v; want %v", tok, err, a.Token())
	}

	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed after Unlock")
	}
	if !errors.Is(a.Err(), lock.ErrReleased) || errors.Is(a.Err(), lock.ErrLost) {
		t.Fatalf("Err after Unlock = %v; want ErrReleased", a.Err())
	}
	if _, err := a.FencingToken(); !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("FencingToken after Unlock = %v; want ErrReleased", err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second Unlock = %v; want ErrNotHeld", err)
	}
	if h := holder(t, b); h.Held() {
		t.Fatalf("Holder after Unlock = %+v; want free", h)
	}
	if ok, err := b.TryLock(ctx); !ok || err != nil {
		t.Fatalf("b.TryLock after release = %v, %v", ok, err)
	}
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
	// Unlock never deletes a key held by someone else.
	if err := a.Unlock(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("a.Unlock of b's lock = %v; want ErrNotHeld", err)
	}
	if h := holder(t, a); h.ID != b.HolderID() {
		t.Fatalf("Holder = %+v; want b", h)
	}

	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.TryLock(ctx); ok || !errors.Is(err, lock.ErrClosed) {
		t.Fatalf("TryLock after Close = %v, %v; want ErrClosed", ok, err)
	}
	if h := holder(t, a); h.Held() {
		t.Fatalf("Close left the key: %+v", h)
	}
}

// Unlock hands the lock over at once: the waiter does not wait for the TTL.
func TestHandoverOnUnlock(t *testing.T) {
	srv := startStore(t)
	a := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: time.Minute})
	cb := dial(t, srv.Addr())
	b := newLock(t, cb, lock.Config{Name: "l", TTL: time.Minute})
	mustLock(t, a)

	got := make(chan error, 1)
	go func() { got <- b.Lock(testCtx(t)) }()
	// b is waiting: it watches the key before it tries a second time.
	waitFor(t, "b to watch the key", func() bool { return srv.Watching(cb.ID(), "l") })
	select {
	case err := <-got:
		t.Fatalf("b.Lock returned %v while a holds the lock", err)
	default:
	}
	start := time.Now()
	if err := a.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("b.Lock: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("handover took %v, as if waiting for the TTL", d)
	}
	if h := holder(t, a); h.ID != b.HolderID() || !b.Token().After(a.Token()) {
		t.Fatalf("Holder %+v, tokens a %v b %v", h, a.Token(), b.Token())
	}
}

// Renewals keep the lock for many TTLs; nobody else gets it meanwhile.
func TestRenewalsKeepTheLock(t *testing.T) {
	srv := startStore(t)
	// Renewals every 200 ms, lost at 400 ms without one: CI, running every
	// package under the race detector on 2 cores, once starved a 150 ms
	// TTL's renewals for its 100 ms renew deadline.
	ttl := 600 * time.Millisecond
	a := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: ttl})
	b := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: ttl})
	mustLock(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 5*ttl)
	defer cancel()
	if err := b.Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b.Lock while a renews = %v; want DeadlineExceeded (a.Err = %v)", err, a.Err())
	}
	if err := a.Err(); err != nil {
		t.Fatalf("a lost the lock while renewing: %v", err)
	}
	h := holder(t, b)
	if h.ID != a.HolderID() || !h.Version.After(a.Token()) {
		t.Fatalf("Holder = %+v; want a, renewed past its token %v", h, a.Token())
	}
	// The renewals did not change a's token.
	if tok, err := a.FencingToken(); err != nil || tok != a.Token() {
		t.Fatalf("FencingToken = %v, %v; want %v", tok, err, a.Token())
	}
}

// Waiters send no request while the holder keeps renewing: they sleep on
// the key's notifications (counted at the store over 9 TTLs).
func TestWaitersSendNothingWhileHolderRenews(t *testing.T) {
	srv := startStore(t)
	// Renewals every 100 ms, lost at 200 ms without one: a loaded CI
	// machine running the race detector missed a 66 ms deadline.
	ttl := 300 * time.Millisecond
	ca := dial(t, srv.Addr())
	a := newLock(t, ca, lock.Config{Name: "l", TTL: ttl})
	mustLock(t, a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An observer of the holder's inbox key sees each waiter join: the last
	// step of its entry.
	joins, err := dial(t, srv.Addr()).Watch(testCtx(t), "l\x00inbox\x00"+a.HolderID())
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, joins)
	var clients []*sskv.Client
	var wg sync.WaitGroup
	for range 3 {
		c := dial(t, srv.Addr())
		clients = append(clients, c)
		w := newLock(t, c, lock.Config{Name: "l", TTL: ttl})
		wg.Go(func() {
			if err := w.Lock(ctx); !errors.Is(err, context.Canceled) {
				t.Errorf("waiter's Lock = %v; want it cancelled", err)
			}
		})
	}
	// Entry costs a waiter nine requests: the SET that finds the lock
	// held, KEYNOTIFY and GET to watch its inbox, the queue's roll call and
	// the key (the holder took a free lock, so it keeps no queue and cannot
	// confirm the join), the GET that finds the holder, and the SET that
	// joins; now and then a GET or two more (sskv reads a missing key up to
	// three times). What counts is that nothing follows the join.
	joined := map[string]bool{}
	for len(joined) < len(clients) {
		select {
		case ev, ok := <-joins.Events():
			if !ok {
				t.Fatalf("%d of %d waiters joined the queue; the observer's watch ended: %v", len(joined), len(clients), joins.Err())
			}
			if ev.Op == sskv.OpSet && len(ev.Value) > 0 && ev.Value[0] == '+' {
				joined[string(ev.Value)] = true
			}
		case <-time.After(waitTimeout):
			t.Fatalf("%d of %d waiters joined the queue", len(joined), len(clients))
		}
	}
	entry := make([]int64, len(clients))
	for i, c := range clients {
		entry[i] = srv.Requests(c.ID())
		if entry[i] < 9 || entry[i] > 13 {
			t.Errorf("waiter %d entered with %d requests; want 9, or a few more GETs", i, entry[i])
		}
	}
	holderBefore := srv.Requests(ca.ID())
	// The span measured, not a wait for an event: 9 TTLs, so that a sleep
	// overshot on a loaded machine stays clear of the waiters' safeguard
	// check, 10.5 TTLs or more after their last try.
	time.Sleep(9 * ttl)
	for i, c := range clients {
		if n := srv.Requests(c.ID()) - entry[i]; n != 0 {
			t.Errorf("waiter %d sent %d requests after its entry, in 9 TTLs while the holder renewed", i, n)
		}
	}
	if n := srv.Requests(ca.ID()) - holderBefore; n < 18 {
		t.Errorf("the holder sent %d requests in 9 TTLs; want renewals every TTL/3", n)
	}
	if a.Err() != nil {
		t.Fatalf("holder lost the lock: %v", a.Err())
	}
	cancel()
	wg.Wait()
}

// Exactly one holder at a time, over many rounds of contention among
// clients on separate connections; tokens increase strictly.
func TestContention(t *testing.T) {
	srv := startStore(t)
	const workers, rounds = 4, 15
	var (
		inside atomic.Int32
		mu     sync.Mutex
		tokens []hlc.Timestamp
		wg     sync.WaitGroup
	)
	for i := range workers {
		l := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: 5 * time.Second, HolderID: fmt.Sprintf("w%d", i)})
		wg.Go(func() {
			for range rounds {
				if err := l.Lock(testCtx(t)); err != nil {
					t.Errorf("%s: Lock: %v", l.HolderID(), err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, l.Token())
				mu.Unlock()
				inside.Add(-1)
				if err := l.Unlock(testCtx(t)); err != nil {
					t.Errorf("%s: Unlock: %v", l.HolderID(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(tokens) != workers*rounds {
		t.Fatalf("%d acquisitions; want %d", len(tokens), workers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if !tokens[i].After(tokens[i-1]) {
			t.Fatalf("token %d (%v) is not after token %d (%v)", i, tokens[i], i-1, tokens[i-1])
		}
	}
}

// A holder that disappears (its client closed without Unlock) is taken over
// soon after its lease expires.
func TestTakeoverAfterHolderDisappears(t *testing.T) {
	srv := startStore(t)
	ttl := 300 * time.Millisecond
	ca := dial(t, srv.Addr())
	a := newLock(t, ca, lock.Config{Name: "l", TTL: ttl})
	b := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: ttl})
	mustLock(t, a)
	got := make(chan error, 1)
	go func() { got <- b.Lock(testCtx(t)) }()

	gone := time.Now()
	_ = ca.Close()
	<-a.Done()
	if !errors.Is(a.Err(), lock.ErrLost) {
		t.Fatalf("a.Err after its client closed = %v; want ErrLost", a.Err())
	}
	if err := <-got; err != nil {
		t.Fatalf("b.Lock: %v", err)
	}
	took := time.Since(gone)
	if took > 10*ttl {
		t.Fatalf("takeover took %v with a TTL of %v", took, ttl)
	}
	if h := holder(t, b); h.ID != b.HolderID() {
		t.Fatalf("Holder = %+v; want b", h)
	}
	t.Logf("takeover %v after the holder's client closed (TTL %v)", took, ttl)
}

// A Lock cancelled while it waits holds nothing and leaves no key and no
// registration behind (the etcd failure modes: a Campaign that returned
// "elected" after its session expired, and a key left after an error).
func TestCancelledLockLeavesNothing(t *testing.T) {
	srv := startStore(t)
	a := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: time.Minute})
	cb := dial(t, srv.Addr())
	b := newLock(t, cb, lock.Config{Name: "l", TTL: time.Minute})
	mustLock(t, a)

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx) }()
	waitFor(t, "b to watch the key", func() bool { return srv.Watching(cb.ID(), "l") })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock = %v; want context.Canceled", err)
	}
	if !errors.Is(b.Err(), lock.ErrNotHeld) {
		t.Fatalf("b.Err = %v; want ErrNotHeld", b.Err())
	}
	waitFor(t, "b's KEYNOTIFY to be stopped", func() bool { return !srv.Watching(cb.ID(), "l") })
	if h := holder(t, a); h.ID != a.HolderID() {
		t.Fatalf("Holder = %+v; want a still", h)
	}
}

// An acquisition whose outcome is unknown (its connection froze with the SET
// in flight) returns by its context's deadline, holds nothing, and leaves no
// key behind once the connection is back: the Lock deletes the key in the
// background, before its next acquisition.
func TestUnknownAcquisitionLeavesNoKey(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	b, err := lock.New(dial(t, proxy.Addr()), lock.Config{Name: "l", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	observer := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l"})

	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	ok, err := b.TryLock(ctx)
	if ok || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLock on a frozen connection = %v, %v; want DeadlineExceeded", ok, err)
	}
	if late := time.Since(start) - 300*time.Millisecond; late > time.Second {
		t.Errorf("TryLock returned %v after its deadline", late)
	}
	if !errors.Is(b.Err(), lock.ErrNotHeld) {
		t.Fatalf("b.Err = %v; want ErrNotHeld", b.Err())
	}
	proxy.Heal()
	// Close waits for the background delete, which the client sends once
	// it has replaced the frozen connection.
	if err := b.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if h := holder(t, observer); h.Held() {
		t.Fatalf("after the unknown acquisition, Holder = %+v; want no key", h)
	}
}

// A lock taken while the waiter's connection was down is only reported held
// once the waiter really holds the key: never on the strength of a
// notification, never after its own lease has gone.
func TestWaiterReconnectsThenAcquires(t *testing.T) {
	srv := startStore(t)
	ttl := 500 * time.Millisecond
	a := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: ttl})
	cb := dial(t, srv.Addr())
	b := newLock(t, cb, lock.Config{Name: "l", TTL: ttl})
	mustLock(t, a)
	got := make(chan error, 1)
	go func() { got <- b.Lock(testCtx(t)) }()
	waitFor(t, "b to watch the key", func() bool { return srv.Watching(cb.ID(), "l") })

	// b's connection drops; meanwhile a releases: b missed the DELETE and
	// must find out from its watch's Resync after the reconnect.
	if err := srv.Drop(cb.ID()); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("b.Lock: %v", err)
	}
	if h := holder(t, a); h.ID != b.HolderID() || b.Err() != nil {
		t.Fatalf("b.Lock returned, but Holder = %+v, b.Err = %v", h, b.Err())
	}
}

// Unlock, Close and a lost lock leave no goroutine behind (goleak checks
// after every test); a closed sskv client ends the holding as lost.
func TestNoGoroutineAfterEnd(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for i := range 3 {
		l, err := lock.New(c, lock.Config{Name: fmt.Sprintf("l%d", i), TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		mustLock(t, l)
		switch i {
		case 0:
			err = l.Unlock(testCtx(t))
		case 1:
			err = l.Close(testCtx(t))
		case 2:
			l.Fenced(l.Token(), sskv.ErrFencingTokenLower)
			<-l.Done()
			if !errors.Is(l.Err(), lock.ErrFenced) || !errors.Is(l.Err(), lock.ErrLost) {
				t.Errorf("Err after Fenced = %v", l.Err())
			}
			err = l.Close(testCtx(t))
		}
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
	}
}
