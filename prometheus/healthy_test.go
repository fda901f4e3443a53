package dsslockprom_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/prometheus"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

const election = "orders/leader"

// member is one process of a group of candidates: its own client (through
// its own proxy, so that the test can cut it off as a kill -9 would), its
// own registry and /metrics endpoint, and an Elector that campaigns again
// each time its work returns.
type member struct {
	name    string
	proxy   *faultproxy.Proxy
	metrics *httptest.Server
	sets    chan struct{} // a SET of this member ended, whatever its outcome (buffered 1)
	resign  chan struct{} // ends the work of this member's term
	out     chan struct{} // this member's Run returned after its resign
	stopped chan error    // a term of this member ended and its resign returned
	rejoin  chan struct{} // lets this member campaign again after it resigned
}

// term is a term that began, and its member.
type term struct {
	m *member
	t *leader.Term
}

func startMember(t *testing.T, ctx context.Context, store, name string, terms chan<- term) *member {
	t.Helper()
	p, err := faultproxy.Start(store, faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	reg := prometheus.NewRegistry()
	cs, err := dsslockprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{
		name:    name,
		proxy:   p,
		metrics: httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		sets:    make(chan struct{}, 1),
		resign:  make(chan struct{}, 1),
		out:     make(chan struct{}, 1),
		stopped: make(chan error, 8),
		rejoin:  make(chan struct{}, 1),
	}
	t.Cleanup(m.metrics.Close)
	hooks := cs.Client()
	bridge := hooks.Request
	hooks.Request = func(verb string, d time.Duration, outcome string) {
		bridge(verb, d, outcome)
		if verb == "SET" {
			select {
			case m.sets <- struct{}{}:
			default:
			}
		}
	}
	// A long PingTimeout keeps a frozen connection (Blackhole) open until
	// it thaws, as a stopped process's connection stays open until the
	// broker's keep alive drops it.
	c, err := sskv.Dial(ctx, sskv.Config{Addr: p.Addr(), ClientID: name, Metrics: hooks,
		KeepAlive: 30 * time.Second, PingTimeout: 30 * time.Second,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e, err := leader.NewElector(c, election, []byte(name),
		leader.WithTTL(3*time.Second),
		leader.WithMetrics(cs.Election(election)),
		leader.OnStartedLeading(func(lt *leader.Term) { terms <- term{m, lt} }),
		leader.OnStoppedLeading(func(err error) { m.stopped <- err }))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			err := e.Run(rctx, func(ctx context.Context, _ *leader.Term) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-m.resign:
					return nil // Run resigns
				}
			})
			if rctx.Err() != nil {
				return
			}
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
				return
			}
			m.out <- struct{}{}
			select {
			case <-rctx.Done():
				return
			case <-m.rejoin:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return m
}

var requestLine = regexp.MustCompile(`(?m)^dsslock_sskv_requests_total\{outcome="([^"]*)",verb="([^"]*)"\} (\S+)$`)

// series is one series of dsslock_sskv_requests_total.
type series struct{ verb, outcome string }

// requests scrapes m's /metrics and returns its request counts, and its
// failed renewals.
func (m *member) requests(t *testing.T) (map[series]float64, float64) {
	t.Helper()
	res, err := http.Get(m.metrics.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %d, %v", m.name, res.StatusCode, err)
	}
	counts := make(map[series]float64)
	for _, l := range requestLine.FindAllSubmatch(body, -1) {
		v, err := strconv.ParseFloat(string(l[3]), 64)
		if err != nil {
			t.Fatalf("scrape %s: %s: %v", m.name, l[0], err)
		}
		counts[series{verb: string(l[2]), outcome: string(l[1])}] = v
	}
	var failures float64
	if l := failuresLine.FindSubmatch(body); l != nil {
		if failures, err = strconv.ParseFloat(string(l[1]), 64); err != nil {
			t.Fatalf("scrape %s: %s: %v", m.name, l[0], err)
		}
	}
	return counts, failures
}

var failuresLine = regexp.MustCompile(`(?m)^dsslock_leader_renewal_failures_total\{election="` + regexp.QuoteMeta(election) + `"\} (\S+)$`)

// healthy scrapes m and fails the test if it shows an outcome other than
// "ok" and "refused", or a failed renewal. It returns the counts.
func (m *member) healthy(t *testing.T, when string) map[series]float64 {
	t.Helper()
	counts, failures := m.requests(t)
	if len(counts) == 0 {
		t.Fatalf("%s, %s: no requests scraped", when, m.name)
	}
	for s, v := range counts {
		if s.outcome != sskv.OutcomeOK && s.outcome != sskv.OutcomeRefused {
			t.Errorf("%s, %s: %v %s requests with outcome %q; a healthy candidate has only ok and refused ones (all: %v)",
				when, m.name, v, s.verb, s.outcome, counts)
		}
	}
	if failures != 0 {
		t.Errorf("%s, %s: %v failed renewals", when, m.name, failures)
	}
	return counts
}

func next(t *testing.T, ctx context.Context, terms <-chan term, what string) term {
	t.Helper()
	select {
	case tm := <-terms:
		return tm
	case <-ctx.Done():
		t.Fatalf("no %s: %v", what, ctx.Err())
		return term{}
	}
}

func wait(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("no %s: %v", what, ctx.Err())
	}
}

// A healthy group of three candidates, scraped through a handover (the
// leader resigns) and a takeover (the leader's process dies and its key
// expires): the campaigns of the followers, the renewals and the resign
// count no error outcome. The followers' campaigns on the fenced key are
// "refused", as contention, where they used to be "service_error"; so is
// the resign of a leader that stalled and woke after another took over.
func TestHealthyGroupScraped(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	terms := make(chan term, 8)
	members := []*member{
		startMember(t, ctx, srv.Addr(), "a", terms),
		startMember(t, ctx, srv.Addr(), "b", terms),
		startMember(t, ctx, srv.Addr(), "c", terms),
	}
	first := next(t, ctx, terms, "first leader")
	for _, m := range members {
		if m != first.m {
			wait(t, ctx, m.sets, m.name+"'s campaign")
		}
	}
	var refused float64
	for _, m := range members {
		refused += m.healthy(t, "elected")[series{"SET", sskv.OutcomeRefused}]
	}
	if refused < 2 {
		t.Errorf("elected: %v refused SETs; want one at least from each follower", refused)
	}

	// Handover: the leader's work returns, it resigns, a follower takes
	// over; the old leader then campaigns again as a follower.
	first.m.resign <- struct{}{}
	second := next(t, ctx, terms, "leader after the handover")
	if second.m == first.m {
		t.Fatalf("%s leads again after it resigned, before it campaigned again", first.m.name)
	}
	wait(t, ctx, first.m.out, first.m.name+"'s resign")
	select {
	case <-first.m.sets: // its renewals'
	default:
	}
	first.m.rejoin <- struct{}{}
	wait(t, ctx, first.m.sets, first.m.name+"'s campaign after its resign")
	for _, m := range members {
		c := m.healthy(t, "after the handover")
		if m == first.m && c[series{"VDEL", sskv.OutcomeOK}] < 1 {
			t.Errorf("after the handover, %s: no VDEL ok (its resign): %v", m.name, c)
		}
	}

	// Takeover: the new leader's process dies (its network is cut for
	// good, as a kill -9 leaves it), its key expires, and one of the other
	// two takes over.
	second.m.healthy(t, "before its death")
	died := time.Now()
	second.m.proxy.Partition()
	third := next(t, ctx, terms, "leader after the takeover")
	if third.m == second.m {
		t.Fatalf("%s leads again while cut off", second.m.name)
	}
	t.Logf("takeover %v after the leader died (TTL 3 s)", time.Since(died).Round(time.Millisecond))
	for _, m := range members {
		if m != second.m {
			m.healthy(t, "after the takeover")
		}
	}

	// A stalled leader wakes: its connection freezes (as a stopped
	// process's), its term is lost on its own clock, its key expires and
	// the last candidate takes over; then it thaws, and its resign's VDEL
	// reaches a key fenced by the new leader. That VDEL is refused, not a
	// service error. (Its renewals during the stall timed out: it was not
	// healthy then.)
	stalled := third.m
	stalled.healthy(t, "before its stall")
	for len(stalled.stopped) > 0 {
		<-stalled.stopped // its earlier terms'
	}
	stalled.proxy.Blackhole()
	fourth := next(t, ctx, terms, "leader after the stall")
	if fourth.m == stalled || fourth.m == second.m {
		t.Fatalf("%s leads after %s's stall", fourth.m.name, stalled.name)
	}
	stalled.proxy.Heal()
	select {
	case err := <-stalled.stopped:
		t.Logf("%s's term ended: %v", stalled.name, err)
	case <-ctx.Done():
		t.Fatalf("%s's resign did not return: %v", stalled.name, ctx.Err())
	}
	counts, _ := stalled.requests(t)
	for s, v := range counts {
		if s.outcome == sskv.OutcomeServiceError || s.outcome == sskv.OutcomeError {
			t.Errorf("after its stall, %s: %v %s requests with outcome %q (all: %v)", stalled.name, v, s.verb, s.outcome, counts)
		}
	}
	if counts[series{"VDEL", sskv.OutcomeRefused}] < 1 {
		t.Errorf("after its stall, %s: no refused VDEL (its resign): %v", stalled.name, counts)
	}
	fourth.m.healthy(t, "after the stall")
}
