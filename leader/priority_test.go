package leader_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// works counts the works running across candidates: never more than one.
type works struct {
	t       *testing.T
	running atomic.Int32
	started map[string]chan *leader.Term // by candidate: each start of its work
	causes  map[string]chan error        // by candidate: why its work's context ended
}

func newWorks(t *testing.T, ids ...string) *works {
	w := &works{t: t, started: map[string]chan *leader.Term{}, causes: map[string]chan error{}}
	for _, id := range ids {
		w.started[id] = make(chan *leader.Term, 10)
		w.causes[id] = make(chan error, 10)
	}
	return w
}

// work is the work of candidate id: it runs until its context ends.
func (w *works) work(id string) func(context.Context, *leader.Term) error {
	return func(ctx context.Context, term *leader.Term) error {
		if n := w.running.Add(1); n > 1 {
			w.t.Errorf("%s's work started while %d others run", id, n-1)
		}
		w.started[id] <- term
		<-ctx.Done()
		w.causes[id] <- context.Cause(ctx)
		w.running.Add(-1)
		return nil
	}
}

func (w *works) waitStart(id string) *leader.Term {
	w.t.Helper()
	select {
	case term := <-w.started[id]:
		return term
	case <-time.After(storetest.WaitTimeout):
		w.t.Fatalf("%s did not lead", id)
	}
	panic("unreachable")
}

// runElector runs an Elector of the given id and options until the test
// ends.
func runElector(t *testing.T, c *sskv.Client, id string, w *works, opts ...leader.Option) *leader.Elector {
	t.Helper()
	e, err := leader.NewElector(c, "e", []byte(id), append(opts, leader.WithCandidateID(id))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Run(ctx, w.work(id))
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return e
}

// expectHandover reads the observed states up to b's term: a's term, at
// most "no leader" (the reservation), then b's; never anyone else.
func expectHandover(t *testing.T, o *observed, a, b string) {
	t.Helper()
	for {
		s := o.next("the handover to " + b)
		switch {
		case s.ID == b && s.HasLeader():
			return
		case s.HasLeader() && s.ID != a:
			t.Fatalf("%s led during the handover from %s to %s", s.ID, a, b)
		}
	}
}

// A candidate of a higher priority that joins takes over once the
// leader's work has returned, at once (the TTL is a minute), and the works
// never overlap.
func TestPriorityTakesOver(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	w := newWorks(t, "a", "b")
	o := observe(t, ctx, dial(t, srv.Addr()))
	o.expect("", "", "the initial state")
	ttl := leader.WithTTL(time.Minute)
	runElector(t, dial(t, srv.Addr()), "a", w, ttl, leader.WithPriority(1))
	w.waitStart("a")
	o.expect("a", "a", "a's term")

	start := time.Now()
	runElector(t, dial(t, srv.Addr()), "b", w, ttl, leader.WithPriority(2))
	w.waitStart("b")
	t.Logf("b leads %v after it joined", time.Since(start))
	if cause := <-w.causes["a"]; !errors.Is(cause, leader.ErrTransferred) {
		t.Fatalf("a's work ended with %v; want ErrTransferred", cause)
	}
	expectHandover(t, o, "a", "b")
}

// A plain Campaign's term of a lower priority ends its Context with
// ErrTransferred while it still holds the key, and Resign hands the
// election to the challenger.
func TestPriorityCampaignResignHandsOver(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	ttl := leader.WithTTL(time.Minute)
	a := campaign(t, dial(t, srv.Addr()), "a", ttl, leader.WithCandidateID("a"), leader.WithPriority(0))
	got := make(chan *leader.Term, 1)
	go func() {
		b, err := leader.Campaign(ctx, dial(t, srv.Addr()), "e", []byte("b"), ttl, leader.WithPriority(5))
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	select {
	case <-a.Context().Done():
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("a's context did not end for the challenger")
	}
	if !errors.Is(context.Cause(a.Context()), leader.ErrTransferred) || a.Err() != nil {
		t.Fatalf("a: cause %v, Err %v; want ErrTransferred while still leading", context.Cause(a.Context()), a.Err())
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		t.FailNow()
	}
	defer func() { _ = b.Resign(ctx) }()
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
}

// Elector.Transfer hands the election to the named live candidate: it
// leads next, nobody in between, although another waits too.
func TestElectorTransfer(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	w := newWorks(t, "a", "b", "c")
	o := observe(t, ctx, dial(t, srv.Addr()))
	o.expect("", "", "the initial state")
	ttl := leader.WithTTL(time.Minute)
	a := runElector(t, dial(t, srv.Addr()), "a", w, ttl)
	w.waitStart("a")
	o.expect("a", "a", "a's term")
	if err := a.Transfer(ctx, "a"); !errors.Is(err, leader.ErrConfig) {
		t.Fatalf("Transfer to itself = %v; want ErrConfig", err)
	}
	for _, id := range []string{"c", "b"} {
		c := dial(t, srv.Addr())
		runElector(t, c, id, w, ttl)
		waitFor(t, id+" to wait", func() bool { return srv.Watching(c.ID(), "e") })
	}
	start := time.Now()
	if err := a.Transfer(ctx, "b"); err != nil {
		t.Fatalf("Transfer: %v", err)
	}
	w.waitStart("b")
	t.Logf("b leads %v after Transfer", time.Since(start))
	if cause := <-w.causes["a"]; !errors.Is(cause, leader.ErrTransferred) {
		t.Fatalf("a's work ended with %v; want ErrTransferred", cause)
	}
	expectHandover(t, o, "a", "b")
	if err := a.Transfer(ctx, "c"); !errors.Is(err, leader.ErrNotLeading) {
		t.Fatalf("Transfer by a follower = %v; want ErrNotLeading", err)
	}
}

// A transfer to a candidate that has gone (its client closed) falls back
// to an ordinary election within about a TTL.
func TestTransferToGoneCandidate(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const ttl = 500 * time.Millisecond
	a := campaign(t, dial(t, srv.Addr()), "a", leader.WithTTL(ttl), leader.WithCandidateID("a"))
	cc := dial(t, srv.Addr())
	got := make(chan *leader.Term, 1)
	go func() {
		c, err := leader.Campaign(ctx, cc, "e", []byte("c"), leader.WithTTL(ttl), leader.WithCandidateID("c"))
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitFor(t, "c to wait", func() bool { return srv.Watching(cc.ID(), "e") })
	cb := dial(t, srv.Addr())
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		_, _ = leader.Campaign(ctx, cb, "e", []byte("b"), leader.WithTTL(ttl), leader.WithCandidateID("b"))
	}()
	waitFor(t, "b to wait", func() bool { return srv.Watching(cb.ID(), "e") })
	_ = cb.Close()
	<-bDone

	start := time.Now()
	if err := a.Transfer(ctx, "b"); err != nil {
		t.Fatalf("Transfer: %v", err)
	}
	select {
	case c := <-got:
		if c == nil {
			t.FailNow()
		}
		defer func() { _ = c.Resign(ctx) }()
		d := time.Since(start)
		t.Logf("c leads %v after the transfer to the gone b", d)
		if d < ttl/2 {
			t.Fatalf("c led %v after the transfer to b; want after the reservation expired", d)
		}
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("no election after the transfer to a gone candidate")
	}
	if err := a.Transfer(ctx, "c"); err == nil {
		t.Fatal("a second Transfer of an ended term succeeded")
	}
}

// A Transfer to an invalid id fails before the term is given up: it goes
// on.
func TestTermTransferInvalidID(t *testing.T) {
	srv := startStore(t)
	a := campaign(t, dial(t, srv.Addr()), "a", leader.WithCandidateID("a"))
	for _, id := range []string{"", "a", "x\ny"} {
		if err := a.Transfer(testCtx(t), id); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("Transfer(%q) = %v; want ErrConfig", id, err)
		}
	}
	if err := a.Err(); err != nil {
		t.Fatalf("the term ended: %v", err)
	}
}

// Candidates of rising priorities join: the highest ends up leading, and
// the works never overlap.
func TestPriorityHighestWins(t *testing.T) {
	srv := startStore(t)
	w := newWorks(t, "a", "b", "c")
	ttl := leader.WithTTL(time.Minute)
	runElector(t, dial(t, srv.Addr()), "a", w, ttl, leader.WithPriority(1))
	w.waitStart("a")
	runElector(t, dial(t, srv.Addr()), "b", w, ttl, leader.WithPriority(2))
	runElector(t, dial(t, srv.Addr()), "c", w, ttl, leader.WithPriority(3))
	term := w.waitStart("c")
	if s := currentLeader(t, dial(t, srv.Addr())); s.ID != "c" || s.Token != term.Token() {
		t.Fatalf("Leader = %+v; want c's term %v", s, term.Token())
	}
}

func TestPriorityConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	// Long enough for a term's keys with a one-byte id, not for the
	// challenge key.
	long := strings.Repeat("e", c.MaxWatchKey()-8)
	for _, tc := range []struct {
		election string
		opts     []leader.Option
	}{
		{"e", []leader.Option{leader.WithPriority(-1)}},
		{long, []leader.Option{leader.WithPriority(1), leader.WithCandidateID("x")}},
	} {
		if _, err := leader.Campaign(testCtx(t), c, tc.election, nil, tc.opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("Campaign(%d bytes) = %v; want ErrConfig", len(tc.election), err)
		}
		if _, err := leader.NewElector(c, tc.election, nil, tc.opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("NewElector(%d bytes) = %v; want ErrConfig", len(tc.election), err)
		}
	}
	// Without WithPriority, the long name is fine.
	if _, err := leader.NewElector(c, long, nil, leader.WithCandidateID("x")); err != nil {
		t.Errorf("NewElector(%d bytes) without priority = %v", len(long), err)
	}
}
