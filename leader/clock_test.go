package leader_test

// Clock faults: a candidate whose clock runs more than a minute ahead of
// the store's (the store refuses its requests), and a store whose clock
// jumps forward and back while terms come and go.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// clockTTL is the lease of these tests' terms: renewals every 333 ms, lost
// at 666 ms without one; enough for -race on a loaded machine.
const clockTTL = time.Second

// promptly bounds how long a refused call may take, against the 10 s its
// context allows: a round trip or two, on a loaded machine.
const promptly = 2 * time.Second

var (
	dialSkewed = storetest.DialSkewed
	skewOf     = storetest.Skew
)

// renewals returns a Metrics option and a function that waits for n
// successful renewals reported after it is called.
func renewals(t *testing.T) (leader.Option, func(n int)) {
	ch := make(chan error, 1024)
	m := leader.Metrics{Renewal: func(_ time.Duration, err error) {
		select {
		case ch <- err:
		default:
		}
	}}
	wait := func(n int) {
		t.Helper()
		for len(ch) > 0 {
			<-ch
		}
		timer := time.NewTimer(storetest.WaitTimeout)
		defer timer.Stop()
		for n > 0 {
			select {
			case err := <-ch:
				if err == nil {
					n--
				}
			case <-timer.C:
				t.Fatalf("timed out waiting for %d more successful renewals", n)
			}
		}
	}
	return leader.WithMetrics(m), wait
}

// campaignAsync campaigns in the background; the term (or nil on an
// error, reported) comes on the channel.
func campaignAsync(t *testing.T, ctx context.Context, c *sskv.Client, id string, opts ...leader.Option) <-chan *leader.Term {
	ch := make(chan *leader.Term, 1)
	opts = append([]leader.Option{leader.WithCandidateID(id), leader.WithTTL(clockTTL)}, opts...)
	go func() {
		term, err := leader.Campaign(ctx, c, "e", []byte("v"+id), opts...)
		if err != nil {
			t.Errorf("Campaign(%s): %v", id, err)
		} else {
			t.Cleanup(func() { _ = term.Resign(context.Background()) })
		}
		ch <- term
	}()
	return ch
}

func elected(t *testing.T, ch <-chan *leader.Term, what string) *leader.Term {
	t.Helper()
	select {
	case term := <-ch:
		if term == nil {
			t.FailNow()
		}
		return term
	case <-time.After(storetest.WaitTimeout):
		t.Fatalf("not elected: %s", what)
	}
	panic("unreachable")
}

func ended(t *testing.T, term *leader.Term) time.Time {
	t.Helper()
	select {
	case <-term.Done():
		return time.Now()
	case <-time.After(storetest.WaitTimeout):
		t.Fatalf("the term did not end within %v", storetest.WaitTimeout)
	}
	panic("unreachable")
}

// A candidate whose clock runs two minutes ahead of the store's: Campaign
// returns at once with the store's refusal instead of retrying until its
// context ends, and leaves no key; Observe and Leader fail the same way.
func TestCampaignClockAhead(t *testing.T) {
	srv := startStore(t)
	c := dialSkewed(t, srv.Addr(), skewOf(2*time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	before, start := srv.Requests(c.ID()), time.Now()
	term, err := leader.Campaign(ctx, c, "e", []byte("v"), leader.WithTTL(clockTTL))
	took, sent := time.Since(start), srv.Requests(c.ID())-before
	t.Logf("Campaign: %v after %v, %d requests", err, took, sent)
	if term != nil || !errors.Is(err, sskv.ErrTimestampSkew) {
		t.Fatalf("Campaign = %v, %v; want the timestamp skew error", term, err)
	}
	if took > promptly || ctx.Err() != nil || sent > 2 {
		t.Errorf("Campaign took %v and %d requests; want it to give up after the refused SET", took, sent)
	}

	before, start = srv.Requests(c.ID()), time.Now()
	_, err = leader.Observe(ctx, c, "e")
	took, sent = time.Since(start), srv.Requests(c.ID())-before
	t.Logf("Observe: %v after %v, %d requests", err, took, sent)
	if !errors.Is(err, sskv.ErrTimestampSkew) || took > promptly || sent > 2 {
		t.Errorf("Observe = %v after %v, %d requests; want the timestamp skew error at once", err, took, sent)
	}
	if _, err := leader.Leader(ctx, c, "e"); !errors.Is(err, sskv.ErrTimestampSkew) {
		t.Errorf("Leader = %v; want the timestamp skew error", err)
	}
	e, err := leader.NewElector(c, "e", []byte("v"), leader.WithTTL(clockTTL))
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = e.Run(ctx, func(context.Context, *leader.Term) error {
		t.Error("work ran without a term")
		return nil
	})
	t.Logf("Elector.Run: %v after %v", err, time.Since(start))
	if !errors.Is(err, sskv.ErrTimestampSkew) || time.Since(start) > promptly {
		t.Errorf("Elector.Run = %v after %v; want the timestamp skew error at once", err, time.Since(start))
	}
	if s := currentLeader(t, dial(t, srv.Addr())); s.HasLeader() {
		t.Fatalf("leader after the refused campaign: %+v", s)
	}
}

// A leader whose clock jumps two minutes ahead mid-term: its renewals are
// refused, its term ends by its renew deadline (ErrLost, with the refusal
// as the last renewal's error), with a few requests and none after; the
// key expires and a waiting candidate is elected with a greater token. One
// leader at a time throughout, as an observer sees it.
func TestLeaderClockJumpsAhead(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	o := observe(t, ctx, dial(t, srv.Addr()))
	o.expect("", "", "the initial state")
	skew := skewOf(0)
	ca := dialSkewed(t, srv.Addr(), skew)
	metrics, waitRenewals := renewals(t)
	a := campaign(t, ca, "va", leader.WithCandidateID("a"), leader.WithTTL(clockTTL), metrics)
	o.expect("a", "va", "a's election")
	cb := dial(t, srv.Addr())
	bch := campaignAsync(t, ctx, cb, "b")
	waitFor(t, "b watching the election", func() bool { return srv.Watching(cb.ID(), "e") })
	waitRenewals(1)

	before, jump := srv.Requests(ca.ID()), time.Now()
	skew.Store(int64(2 * time.Minute))
	lost := ended(t, a)
	sent := srv.Requests(ca.ID()) - before
	err := a.Err()
	t.Logf("term lost %v after the jump, %d requests; Err = %v", lost.Sub(jump), sent, err)
	if !errors.Is(err, leader.ErrLost) || !errors.Is(err, lock.ErrRenewDeadline) || !errors.Is(err, sskv.ErrTimestampSkew) {
		t.Fatalf("Err = %v; want ErrLost, ErrRenewDeadline and the timestamp skew", err)
	}
	if rd := clockTTL * 2 / 3; lost.Sub(jump) > rd+promptly {
		t.Errorf("lost %v after the jump; want by the renew deadline (%v)", lost.Sub(jump), rd)
	}
	if sent > 15 {
		t.Errorf("%d requests between the jump and the loss; want a few, with backoff", sent)
	}
	if _, err := a.FencingToken(); !errors.Is(err, leader.ErrLost) {
		t.Errorf("FencingToken after the loss = %v; want ErrLost", err)
	}

	o.expect("", "", "a's key expired")
	b := elected(t, bch, "b after a's key expired")
	o.expect("b", "vb", "b's election")
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
	// a, lost, sends nothing more but the end of its key's watch (a
	// KEYNOTIFY STOP, refused too) over a TTL, and cannot proclaim.
	before = srv.Requests(ca.ID())
	time.Sleep(clockTTL) // the span measured, not a wait for an event
	if n := srv.Requests(ca.ID()) - before; n > 1 {
		t.Errorf("a sent %d requests in a TTL after its term ended; want at most its watch's STOP", n)
	}
	if err := a.Proclaim(ctx, []byte("a again")); !errors.Is(err, leader.ErrLost) {
		t.Errorf("Proclaim after the loss = %v; want ErrLost", err)
	}
	if s := currentLeader(t, cb); s.ID != "b" || s.Token != b.Token() {
		t.Fatalf("Leader = %+v; want b", s)
	}
}

// Terms across jumps of the store's clock: +30 s, back 50 s (to -20 s),
// forward 2 min (beyond MaxDrift). Each leader keeps its term across a jump
// (renewals go on), each new term's token is greater than every earlier one
// although the store's clock went back, one candidate leads at a time as
// the observer and Leader see it, and a write fenced with an earlier term's
// token is refused. Then the clock steps back 2 min (beyond MaxDrift): the
// store's clock is ahead of its wall clock by more than MaxDrift and it
// refuses every request until real time catches up; the leader loses its
// term by its renew deadline, a new campaign fails at once, nothing hangs.
func TestTermsAcrossStoreClockJumps(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	o := observe(t, ctx, dial(t, srv.Addr()))
	o.expect("", "", "the initial state")
	var tokens []hlc.Timestamp
	newTerm := func(term *leader.Term, id string) {
		t.Helper()
		if s := o.next(id + "'s election"); s.HasLeader() {
			t.Fatalf("observed %+v; want nobody leading between terms", s)
		}
		if s := o.expect(id, "v"+id, id+"'s election"); s.Token != term.Token() {
			t.Fatalf("observed token %v; want %v", s.Token, term.Token())
		}
		if s := currentLeader(t, dial(t, srv.Addr())); s.ID != id || s.Token != term.Token() {
			t.Fatalf("Leader = %+v; want %s", s, id)
		}
		if len(tokens) > 0 && !term.Token().After(tokens[len(tokens)-1]) {
			t.Fatalf("%s's token %v is not after the previous %v", id, term.Token(), tokens[len(tokens)-1])
		}
		tokens = append(tokens, term.Token())
	}

	// a leads; the store's clock jumps 30 s forward; a keeps its term.
	ca := dial(t, srv.Addr())
	ma, waitA := renewals(t)
	a := campaign(t, ca, "va", leader.WithCandidateID("a"), leader.WithTTL(clockTTL), ma)
	o.expect("a", "va", "a's election")
	tokens = append(tokens, a.Token())
	srv.SetClockOffset(30 * time.Second)
	waitA(2)
	if err := a.Err(); err != nil {
		t.Fatalf("a lost its term when the store's clock jumped forward: %v", err)
	}

	// a crashes: b is elected when a's key expires, with a greater token.
	cb := dial(t, srv.Addr())
	mb, waitB := renewals(t)
	bch := campaignAsync(t, ctx, cb, "b", mb)
	waitFor(t, "b watching the election", func() bool { return srv.Watching(cb.ID(), "e") })
	_ = ca.Close()
	ended(t, a)
	b := elected(t, bch, "b after a crashed")
	newTerm(b, "b")
	if _, err := cb.Set(ctx, "resource", []byte("b"), sskv.SetOptions{FencingToken: b.Token()}); err != nil {
		t.Fatalf("write fenced with b's token: %v", err)
	}

	// The store's clock steps back 50 s: b keeps its term; b resigns and
	// c's token is greater although the store's clock reads earlier.
	srv.SetClockOffset(-20 * time.Second)
	waitB(2)
	if err := b.Proclaim(ctx, []byte("vb")); err != nil {
		t.Fatalf("Proclaim after the step back: %v", err)
	}
	cc := dial(t, srv.Addr())
	mc, waitC := renewals(t)
	cch := campaignAsync(t, ctx, cc, "c", mc)
	waitFor(t, "c watching the election", func() bool { return srv.Watching(cc.ID(), "e") })
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	c := elected(t, cch, "c after b resigned")
	newTerm(c, "c")
	if _, err := cc.Set(ctx, "resource", []byte("c"), sskv.SetOptions{FencingToken: c.Token()}); err != nil {
		t.Fatalf("write fenced with c's token: %v", err)
	}
	_, err := cb.Set(ctx, "resource", []byte("b again"), sskv.SetOptions{FencingToken: b.Token()})
	if !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("write fenced with b's token after c's = %v; want ErrFencingTokenLower", err)
	}

	// The store's clock jumps 2 min forward (beyond MaxDrift): c keeps its
	// term; d's token is greater.
	srv.SetClockOffset(2 * time.Minute)
	waitC(2)
	if err := c.Proclaim(ctx, []byte("vc")); err != nil {
		t.Fatalf("Proclaim after the forward jump: %v", err)
	}
	cd := dial(t, srv.Addr())
	dch := campaignAsync(t, ctx, cd, "d")
	waitFor(t, "d watching the election", func() bool { return srv.Watching(cd.ID(), "e") })
	if err := c.Err(); err != nil {
		t.Fatalf("c lost its term across the jumps: %v", err)
	}
	if err := c.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	d := elected(t, dch, "d after c resigned")
	newTerm(d, "d")
	if !slices.IsSortedFunc(tokens, hlc.Timestamp.Compare) || len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Fatalf("tokens not strictly increasing: %v", tokens)
	}

	// The store's clock steps back 2 min (beyond MaxDrift): d loses its
	// term by its renew deadline; a new campaign is refused at once.
	before, jump := srv.Requests(cd.ID()), time.Now()
	srv.SetClockOffset(0)
	lost := ended(t, d)
	err = d.Err()
	t.Logf("d lost %v after the step back, %d requests; Err = %v", lost.Sub(jump), srv.Requests(cd.ID())-before, err)
	var se *sskv.ServiceError
	if !errors.Is(err, leader.ErrLost) || !errors.Is(err, lock.ErrRenewDeadline) || !errors.As(err, &se) {
		t.Fatalf("Err = %v; want ErrLost, ErrRenewDeadline and the store's refusal", err)
	}
	if rd := clockTTL * 2 / 3; lost.Sub(jump) > rd+promptly {
		t.Errorf("lost %v after the step back; want by the renew deadline (%v)", lost.Sub(jump), rd)
	}
	ce := dial(t, srv.Addr())
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = leader.Campaign(cctx, ce, "e", []byte("ve"), leader.WithTTL(clockTTL))
	t.Logf("Campaign after the step back: %v after %v, %d requests", err, time.Since(start), srv.Requests(ce.ID()))
	if !errors.As(err, &se) || se.Message != localstore.MsgClockAhead || time.Since(start) > promptly {
		t.Fatalf("Campaign = %v after %v; want the store's MsgClockAhead at once", err, time.Since(start))
	}
}

// Contending candidates while the store's clock jumps back and forth
// within MaxDrift, one jump per term: one leader at a time, and tokens
// strictly increasing in election order and as an observer sees them.
func TestOneLeaderAtATimeAcrossClockJumps(t *testing.T) {
	srv := startStore(t)
	const candidates, terms = 3, 20
	// The furthest the store's clock goes back from the furthest it went
	// forward is 55 s: within MaxDrift (60 s).
	offsets := []time.Duration{30 * time.Second, -20 * time.Second, 25 * time.Second, -25 * time.Second, 0}
	ctx := testCtx(t)
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	states, err := leader.Observe(octx, dial(t, srv.Addr()), "e")
	if err != nil {
		t.Fatal(err)
	}
	var observedTokens []hlc.Timestamp
	var observing sync.WaitGroup
	observing.Go(func() {
		for s := range states {
			if s.HasLeader() {
				observedTokens = append(observedTokens, s.Token)
			}
		}
	})
	var (
		active  atomic.Int32
		mu      sync.Mutex
		tokens  []hlc.Timestamp
		elected atomic.Int32
		wg      sync.WaitGroup
	)
	for i := range candidates {
		c := dial(t, srv.Addr())
		wg.Go(func() {
			for {
				term, err := leader.Campaign(ctx, c, "e", []byte{byte('a' + i)}, leader.WithTTL(clockTTL))
				if err != nil {
					t.Error(err)
					return
				}
				if n := active.Add(1); n != 1 {
					t.Errorf("%d leaders at once", n)
				}
				mu.Lock()
				tokens = append(tokens, term.Token())
				mu.Unlock()
				n := elected.Add(1)
				srv.SetClockOffset(offsets[int(n)%len(offsets)]) // during the term
				if err := term.Err(); err != nil {
					t.Errorf("term lost: %v", err)
				}
				active.Add(-1)
				if err := term.Resign(ctx); err != nil {
					t.Error(err)
					return
				}
				if n >= terms {
					return
				}
			}
		})
	}
	wg.Wait()
	stopObserving()
	observing.Wait()
	if !slices.IsSortedFunc(tokens, hlc.Timestamp.Compare) || len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Fatalf("tokens not strictly increasing in election order: %v", tokens)
	}
	if !slices.IsSortedFunc(observedTokens, hlc.Timestamp.Compare) || len(slices.Compact(slices.Clone(observedTokens))) != len(observedTokens) {
		t.Fatalf("observed tokens not strictly increasing: %v", observedTokens)
	}
	t.Logf("%d terms, %d observed; first token %v, last %v", len(tokens), len(observedTokens), tokens[0], tokens[len(tokens)-1])
}
