package leader_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	startStore = storetest.Start
	testCtx    = storetest.Ctx
	dial       = storetest.Dial
	waitFor    = storetest.Eventually
)

func campaign(t testing.TB, c *sskv.Client, value string, opts ...leader.Option) *leader.Term {
	t.Helper()
	term, err := leader.Campaign(testCtx(t), c, "e", []byte(value), opts...)
	if err != nil {
		t.Fatalf("Campaign(%s): %v", value, err)
	}
	t.Cleanup(func() { _ = term.Resign(context.Background()) })
	return term
}

func proxied(t testing.TB, addr string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(addr, faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func currentLeader(t testing.TB, c *sskv.Client) leader.State {
	t.Helper()
	s, err := leader.Leader(testCtx(t), c, "e")
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	return s
}

func TestOptionsValidation(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	for _, opts := range [][]leader.Option{
		{leader.WithTTL(time.Second), leader.WithRenewDeadline(time.Second)},
		{leader.WithTTL(1500 * time.Microsecond)},
		{leader.WithCandidateID("a\nb")},
	} {
		if _, err := leader.Campaign(ctx, c, "e", nil, opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("Campaign with invalid options = %v; want ErrConfig", err)
		}
		if _, err := leader.NewElector(c, "e", nil, opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("NewElector with invalid options = %v; want ErrConfig", err)
		}
	}
	if _, err := leader.Campaign(ctx, c, "", nil); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("Campaign with no election = %v; want ErrConfig", err)
	}
}

// A term reports its token, value and state; Leader and Proclaim agree; a
// term ends on Resign.
func TestCampaignProclaimResign(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	other := dial(t, srv.Addr())
	if s := currentLeader(t, other); s.HasLeader() {
		t.Fatalf("Leader before any campaign = %+v", s)
	}
	term := campaign(t, c, "10.0.0.1", leader.WithCandidateID("a"))
	if term.Err() != nil || term.Token().IsZero() || term.CandidateID() != "a" {
		t.Fatalf("term: err %v, token %v, id %q", term.Err(), term.Token(), term.CandidateID())
	}
	want := leader.State{ID: "a", Value: []byte("10.0.0.1"), Token: term.Token()}
	if s := currentLeader(t, other); !sameState(s, want) {
		t.Fatalf("Leader = %+v; want %+v", s, want)
	}
	if err := term.Proclaim(testCtx(t), []byte("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	want.Value = []byte("10.0.0.2")
	if s := currentLeader(t, other); !sameState(s, want) || string(term.Value()) != "10.0.0.2" {
		t.Fatalf("after Proclaim, Leader = %+v, Value %q", s, term.Value())
	}
	if err := term.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	<-term.Done()
	if !errors.Is(term.Err(), leader.ErrResigned) || !errors.Is(context.Cause(term.Context()), leader.ErrResigned) {
		t.Fatalf("after Resign, Err = %v", term.Err())
	}
	if err := term.Resign(testCtx(t)); err != nil {
		t.Fatalf("second Resign = %v", err)
	}
	if err := term.Proclaim(testCtx(t), []byte("x")); !errors.Is(err, leader.ErrResigned) {
		t.Fatalf("Proclaim after Resign = %v; want ErrResigned", err)
	}
	if s := currentLeader(t, other); s.HasLeader() {
		t.Fatalf("after Resign, Leader = %+v", s)
	}
}

func sameState(s, u leader.State) bool {
	return s.ID == u.ID && s.Token == u.Token && string(s.Value) == string(u.Value)
}

// Contending candidates: one leader at a time over many terms, and tokens
// that increase strictly from term to term.
func TestOneLeaderAtATime(t *testing.T) {
	srv := startStore(t)
	const candidates, terms = 4, 40
	var (
		active  atomic.Int32
		mu      sync.Mutex
		tokens  []hlc.Timestamp
		elected atomic.Int32
		wg      sync.WaitGroup
	)
	ctx := testCtx(t)
	for i := range candidates {
		c := dial(t, srv.Addr())
		wg.Go(func() {
			for elected.Load() < terms {
				term, err := leader.Campaign(ctx, c, "e", []byte{byte('a' + i)}, leader.WithTTL(2*time.Second))
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
				elected.Add(1)
				time.Sleep(time.Millisecond) // the work of the term
				active.Add(-1)
				if err := term.Resign(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if !slices.IsSortedFunc(tokens, hlc.Timestamp.Compare) || len(slices.Compact(slices.Clone(tokens))) != len(tokens) {
		t.Fatalf("tokens not strictly increasing in election order: %v", tokens)
	}
}

// Resign hands over at once: the waiting candidate is elected without
// waiting for the TTL.
func TestResignHandsOver(t *testing.T) {
	srv := startStore(t)
	a := campaign(t, dial(t, srv.Addr()), "a", leader.WithTTL(time.Minute))
	cb := dial(t, srv.Addr())
	got := make(chan *leader.Term, 1)
	go func() {
		term, err := leader.Campaign(testCtx(t), cb, "e", []byte("b"), leader.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		got <- term
	}()
	waitFor(t, "b to watch", func() bool { return srv.Watching(cb.ID(), "e") })
	start := time.Now()
	if err := a.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { _ = b.Resign(context.Background()) })
	t.Logf("handover in %v", time.Since(start))
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v not after a's %v", b.Token(), a.Token())
	}
}

// A crashed leader (its client gone, no renewal, no release) is replaced
// soon after its lease expires; followers send no request meanwhile.
func TestCrashedLeaderReplaced(t *testing.T) {
	srv := startStore(t)
	// Long enough that a loaded machine running the race detector does not
	// starve the renewals for the renew deadline (a third of the TTL less).
	const ttl = 400 * time.Millisecond
	ca := dial(t, srv.Addr())
	a := campaign(t, ca, "a", leader.WithTTL(ttl))
	var followers []*sskv.Client
	got := make(chan *leader.Term, 3)
	for range 3 {
		c := dial(t, srv.Addr())
		followers = append(followers, c)
		go func() {
			term, err := leader.Campaign(testCtx(t), c, "e", []byte(c.ID()), leader.WithTTL(ttl))
			if err != nil {
				t.Error(err)
			}
			got <- term
		}()
	}
	// Entry: the SET refused by the fence, then KEYNOTIFY and the GET
	// whose state is the watch's first event (what holds the key, checked
	// for lock.ErrNotALock).
	const entry = 3
	for _, c := range followers {
		waitFor(t, "the follower's entry", func() bool { return srv.Requests(c.ID()) >= entry })
	}
	time.Sleep(10 * ttl) // the span measured, not a wait for an event
	for i, c := range followers {
		if n := srv.Requests(c.ID()) - entry; n != 0 {
			t.Errorf("follower %d sent %d requests after its entry, in 10 TTLs while the leader renewed", i, n)
		}
	}
	if a.Err() != nil {
		t.Fatalf("the leader lost its term while renewing: %v", a.Err())
	}
	crashed := time.Now()
	_ = ca.Close()
	<-a.Done()
	if !errors.Is(a.Err(), lock.ErrClosed) && !errors.Is(a.Err(), leader.ErrLost) {
		t.Fatalf("a.Err = %v", a.Err())
	}
	b := <-got
	if b == nil {
		t.FailNow()
	}
	t.Logf("replaced %v after the crash (TTL %v)", time.Since(crashed), ttl)
	if err := b.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if term := <-got; term != nil {
			_ = term.Resign(testCtx(t))
		}
	}
}

// A paused leader (its connection frozen, the store untouched) ends its
// term on its own clock while the store still holds its key; after the
// takeover its fenced writes are refused and the new leader's land.
func TestPausedLeader(t *testing.T) {
	srv := startStore(t)
	const ttl = 600 * time.Millisecond
	proxy := proxied(t, srv.Addr())
	ca := dial(t, proxy.Addr())
	a := campaign(t, ca, "a", leader.WithTTL(ttl), leader.WithCandidateID("a"))
	wa := fenced.New(ca, a)
	ctx := testCtx(t)
	if _, err := wa.Set(ctx, "data", []byte("from a"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	cb := dial(t, srv.Addr())
	proxy.Blackhole()
	<-a.Context().Done()
	if !errors.Is(a.Err(), lock.ErrRenewDeadline) {
		t.Fatalf("a.Err = %v; want the renew deadline", a.Err())
	}
	// The store has not expired a's key yet: a stopped first.
	if s := currentLeader(t, cb); s.ID != "a" {
		t.Fatalf("when a's term ended, Leader = %+v; want a still in the store", s)
	}
	b := campaign(t, cb, "b", leader.WithTTL(ttl), leader.WithCandidateID("b"))
	wb := fenced.New(cb, b)
	if _, err := wb.Set(ctx, "data", []byte("from b"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	if _, err := wa.Set(ctx, "data", []byte("late a"), sskv.SetOptions{}); !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("a's write after the takeover = %v; want ErrStale", err)
	}
	// Even sent with a's token directly, the store refuses it.
	if _, err := ca.Set(ctx, "data", []byte("late a"), sskv.SetOptions{FencingToken: a.Token()}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("a's token at the store = %v; want ErrFencingTokenLower", err)
	}
	if err := a.Proclaim(ctx, []byte("late")); !errors.Is(err, leader.ErrLost) {
		t.Fatalf("a's Proclaim = %v; want ErrLost", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("a's Resign after the takeover = %v; want nil (the key is b's)", err)
	}
	if s := currentLeader(t, cb); s.ID != "b" || b.Err() != nil {
		t.Fatalf("Leader = %+v, b.Err = %v; want b leading", s, b.Err())
	}
	if res, err := cb.Get(ctx, "data"); err != nil || string(res.Value) != "from b" {
		t.Fatalf("data = %q, %v; want b's write", res.Value, err)
	}
}

type observed struct {
	t  *testing.T
	ch <-chan leader.State
}

func observe(t *testing.T, ctx context.Context, c *sskv.Client) *observed {
	t.Helper()
	ch, err := leader.Observe(ctx, c, "e")
	if err != nil {
		t.Fatal(err)
	}
	return &observed{t, ch}
}

func (o *observed) next(what string) leader.State {
	o.t.Helper()
	select {
	case s, ok := <-o.ch:
		if !ok {
			o.t.Fatalf("Observe closed while waiting for %s", what)
		}
		return s
	case <-time.After(storetest.WaitTimeout):
		o.t.Fatalf("no change while waiting for %s", what)
	}
	panic("unreachable")
}

func (o *observed) expect(id, value string, what string) leader.State {
	o.t.Helper()
	s := o.next(what)
	if s.ID != id || string(s.Value) != value || s.HasLeader() != (id != "") {
		o.t.Fatalf("%s: observed %+v; want leader %q with %q", what, s, id, value)
	}
	return s
}

// Observe reports the state at the start and each change after, "no
// leader" included, and nothing for renewals.
func TestObserve(t *testing.T) {
	srv := startStore(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	o := observe(t, ctx, dial(t, srv.Addr()))
	o.expect("", "", "the initial state")
	// Long enough that a loaded machine running the race detector does not
	// starve the renewals, which would be a change observed.
	const ttl = 300 * time.Millisecond
	a := campaign(t, dial(t, srv.Addr()), "va", leader.WithCandidateID("a"), leader.WithTTL(ttl))
	if s := o.expect("a", "va", "a's election"); s.Token != a.Token() {
		t.Fatalf("observed token %v; want %v", s.Token, a.Token())
	}
	if err := a.Proclaim(ctx, []byte("va2")); err != nil {
		t.Fatal(err)
	}
	o.expect("a", "va2", "a's Proclaim")
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	o.expect("", "", "a's resignation")
	b := campaign(t, dial(t, srv.Addr()), "vb", leader.WithCandidateID("b"), leader.WithTTL(ttl))
	o.expect("b", "vb", "b's election")
	// Renewals for several TTLs are not changes.
	time.Sleep(3 * ttl) // the span observed, not a wait for an event
	select {
	case s := <-o.ch:
		t.Fatalf("observed %+v while b renewed", s)
	default:
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	o.expect("", "", "b's resignation")
	cancel()
	for range o.ch {
	}
}

// A change made while the observer's connection is down is reported after
// the reconnect, as a Resync state.
func TestObserveAcrossKick(t *testing.T) {
	srv := startStore(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	proxy := proxied(t, srv.Addr())
	co := dial(t, proxy.Addr())
	o := observe(t, ctx, co)
	o.expect("", "", "the initial state")
	a := campaign(t, dial(t, srv.Addr()), "va", leader.WithCandidateID("a"))
	o.expect("a", "va", "a's election")

	proxy.Blackhole()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := campaign(t, dial(t, srv.Addr()), "vb", leader.WithCandidateID("b"))
	proxy.Cut() // the observer's client reconnects
	proxy.Heal()
	s := o.next("b's election, seen after the reconnect")
	if s.ID != "b" || !s.Resync || s.Token != b.Token() {
		t.Fatalf("after the reconnect, observed %+v; want b, as a Resync", s)
	}
	cancel()
	for range o.ch {
	}
}

// The run loop: work runs only while leading, never two at once; on a loss
// its context ends, the term is given up once it returned, and the
// candidate campaigns again. The health check fails while work outlives
// its term.
func TestElectorRun(t *testing.T) {
	srv := startStore(t)
	// Long enough that a loaded machine does not starve the second term's
	// renewals: it must last until the test cancels Run.
	const ttl = 600 * time.Millisecond
	proxy := proxied(t, srv.Addr())
	ca := dial(t, proxy.Addr())
	var (
		running atomic.Int32
		started = make(chan *leader.Term, 10)
		stopped = make(chan error, 10)
		release = make(chan struct{}) // lets a work that lost its term return
	)
	e, err := leader.NewElector(ca, "e", []byte("a"), leader.WithTTL(ttl),
		leader.WithHealthTolerance(50*time.Millisecond),
		leader.OnStartedLeading(func(t *leader.Term) { started <- t }),
		leader.OnStoppedLeading(func(err error) { stopped <- err }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- e.Run(ctx, func(ctx context.Context, term *leader.Term) error {
			if n := running.Add(1); n != 1 {
				t.Errorf("%d works at once", n)
			}
			defer running.Add(-1)
			<-ctx.Done()
			if term.Err() != nil && ctx.Err() != nil && context.Cause(ctx) == term.Err() {
				<-release // a work slow to stop after its term ended
			}
			return ctx.Err()
		})
	}()
	first := <-started
	if !e.Leading() || e.Check() != nil {
		t.Fatalf("leading: Leading %v, Check %v", e.Leading(), e.Check())
	}
	srvHealth := httptest.NewServer(e)
	defer srvHealth.Close()
	if code := get(t, srvHealth.URL); code != http.StatusOK {
		t.Fatalf("healthz = %d while leading", code)
	}

	proxy.Blackhole()
	<-first.Done()
	// The work has not returned: after the tolerance, unhealthy.
	waitFor(t, "the health check to fail", func() bool { return e.Check() != nil })
	if code := get(t, srvHealth.URL); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz = %d while a lost term's work runs", code)
	}
	proxy.Heal()
	close(release)
	if err := <-stopped; !errors.Is(err, leader.ErrLost) {
		t.Fatalf("OnStoppedLeading(%v); want ErrLost", err)
	}
	second := <-started
	if !second.Token().After(first.Token()) {
		t.Fatalf("second term's token %v not after %v", second.Token(), first.Token())
	}
	if e.Check() != nil {
		t.Fatalf("Check = %v in the second term", e.Check())
	}
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want Canceled", err)
	}
	if err := <-stopped; !errors.Is(err, leader.ErrResigned) {
		t.Fatalf("OnStoppedLeading(%v) after cancel; want ErrResigned", err)
	}
	if s := currentLeader(t, dial(t, srv.Addr())); s.HasLeader() {
		t.Fatalf("after Run returned, Leader = %+v; want the key released", s)
	}
}

func get(t *testing.T, url string) int {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	return res.StatusCode
}

// Work that returns while its term lasts ends Run: the term is resigned.
func TestElectorWorkReturns(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	var news []leader.State
	var mu sync.Mutex
	e, err := leader.NewElector(c, "e", []byte("a"), leader.OnNewLeader(func(s leader.State) {
		mu.Lock()
		news = append(news, s)
		mu.Unlock()
	}))
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := e.Run(testCtx(t), func(ctx context.Context, term *leader.Term) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Run = %v; want the work's error", err)
	}
	if s := currentLeader(t, c); s.HasLeader() {
		t.Fatalf("after Run, Leader = %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(news) == 0 || news[0].HasLeader() {
		t.Fatalf("OnNewLeader got %+v; want the initial state, no leader, first", news)
	}
}

// A connection dropped mid-campaign leaves no zombie candidate and no
// phantom leadership: a campaign that gives up leaves no key, and one that
// goes on after the reconnect is elected only when it holds the key.
func TestDropMidCampaign(t *testing.T) {
	srv := startStore(t)
	proxy := proxied(t, srv.Addr())
	cb := dial(t, proxy.Addr())
	other := dial(t, srv.Addr())

	// A campaign on a frozen connection gives up with its context and
	// leaves nothing, once the connection is back.
	proxy.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if _, err := leader.Campaign(ctx, cb, "e", []byte("b")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("frozen Campaign = %v; want DeadlineExceeded", err)
	}
	cancel()
	proxy.Cut()
	proxy.Heal()
	// A TTL of 2 s: b, having reconnected, waits a TTL before it takes
	// the free key (see lock.Lock.Lock).
	a := campaign(t, other, "a", leader.WithCandidateID("a"), leader.WithTTL(2*time.Second))
	if s := currentLeader(t, other); s.ID != "a" {
		t.Fatalf("Leader = %+v; want a", s)
	}

	// b waits; its connection drops while a resigns; b is elected after it
	// reconnects, and then holds the key.
	got := make(chan *leader.Term, 1)
	go func() {
		term, err := leader.Campaign(testCtx(t), cb, "e", []byte("b"), leader.WithCandidateID("b"), leader.WithTTL(2*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- term
	}()
	waitFor(t, "b to watch", func() bool { return srv.Watching(cb.ID(), "e") })
	proxy.Blackhole()
	if err := a.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	proxy.Heal()
	b := <-got
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { _ = b.Resign(context.Background()) })
	if s := currentLeader(t, other); s.ID != "b" || s.Token != b.Token() || b.Err() != nil {
		t.Fatalf("Leader = %+v, b.Err %v; want b", s, b.Err())
	}
}

// Closing the client ends its terms at once.
func TestClientCloseEndsTerm(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	term := campaign(t, c, "a", leader.WithTTL(time.Minute))
	_ = c.Close()
	<-term.Done()
	if !errors.Is(term.Err(), lock.ErrClosed) || !errors.Is(term.Err(), leader.ErrLost) {
		t.Fatalf("Err after the client closed = %v", term.Err())
	}
	if _, err := term.FencingToken(); err == nil {
		t.Fatal("FencingToken after the client closed succeeded")
	}
}

// A leader whose key is deleted behind its back (by hand, or lost by a
// store) ends its term at once instead of re-creating the key with its
// next renewal, after another candidate may have led in between.
func TestKeyDeletedEndsTerm(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	term := campaign(t, c, "a", leader.WithTTL(time.Minute))
	other := dial(t, srv.Addr())
	waitFor(t, "the leader to watch its key", func() bool { return srv.Watching(c.ID(), "e") })
	if _, err := other.Del(testCtx(t), "e", sskv.DelOptions{FencingToken: term.Token()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-term.Done():
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("the term did not end when its key was deleted")
	}
	if !errors.Is(term.Err(), lock.ErrKeyLost) {
		t.Fatalf("Err after the key was deleted = %v; want ErrKeyLost", term.Err())
	}
}
