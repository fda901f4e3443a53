package dsslockprom_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/prometheus"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// candidate is one process of an election: its own client, registry and
// /metrics endpoint.
type candidate struct {
	metrics *httptest.Server
	started chan *leader.Term
	stop    context.CancelFunc
	done    chan error
}

func startCandidate(t *testing.T, ctx context.Context, addr, name string) *candidate {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := dsslockprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: name, Metrics: m.Client()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	cd := &candidate{
		metrics: httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		started: make(chan *leader.Term, 4),
		done:    make(chan error, 1),
	}
	t.Cleanup(cd.metrics.Close)
	e, err := leader.NewElector(c, "orders/leader", []byte(name),
		leader.WithTTL(2*time.Second),
		leader.WithMetrics(m.Election("orders/leader")),
		leader.OnStartedLeading(func(t *leader.Term) { cd.started <- t }))
	if err != nil {
		t.Fatal(err)
	}
	// A lock beside the election, for the lock's renewal metrics.
	l, err := lock.New(c, lock.Config{Name: "jobs/" + name, TTL: 300 * time.Millisecond, OnRenewal: m.LockRenewal("jobs/" + name)})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	rctx, cancel := context.WithCancel(ctx)
	cd.stop = cancel
	go func() {
		cd.done <- e.Run(rctx, func(ctx context.Context, _ *leader.Term) error {
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	t.Cleanup(func() { cancel(); <-cd.done })
	return cd
}

// scrape returns the value of the sample line that matches series (a
// metric name with its labels, as the text format writes them), or -1.
func (cd *candidate) scrape(t *testing.T, series string) float64 {
	t.Helper()
	res, err := http.Get(cd.metrics.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d, %v", res.StatusCode, err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// Two processes in one election, each exporting its metrics: after a
// handover, the scrapes show who leads, the terms begun, and the requests
// and renewals behind them.
func TestHandoverScraped(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a := startCandidate(t, ctx, srv.Addr(), "a")
	<-a.started
	b := startCandidate(t, ctx, srv.Addr(), "b")

	const leading = `dsslock_leader_leading{election="orders/leader"}`
	const terms = `dsslock_leader_terms_total{election="orders/leader"}`
	if got := a.scrape(t, leading); got != 1 {
		t.Fatalf("a: %s = %v; want 1", leading, got)
	}
	if got := b.scrape(t, leading); got == 1 {
		t.Fatalf("b: %s = 1 while a leads", leading)
	}

	a.stop() // a resigns: a handover
	if err := <-a.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a's Run = %v", err)
	}
	a.done <- nil // for the cleanup
	select {
	case <-b.started:
	case <-ctx.Done():
		t.Fatal("b never led")
	}
	for _, c := range []struct {
		who    string
		cd     *candidate
		series string
		want   func(float64) bool
	}{
		{"a", a, leading, func(v float64) bool { return v == 0 }},
		{"a", a, terms, func(v float64) bool { return v == 1 }},
		{"b", b, leading, func(v float64) bool { return v == 1 }},
		{"b", b, terms, func(v float64) bool { return v == 1 }},
		{"a", a, `dsslock_sskv_requests_total{outcome="ok",verb="SET"}`, func(v float64) bool { return v >= 2 }},
		{"a", a, `dsslock_sskv_requests_total{outcome="ok",verb="VDEL"}`, func(v float64) bool { return v >= 1 }},
		{"b", b, `dsslock_sskv_requests_total{outcome="ok",verb="KEYNOTIFY"}`, func(v float64) bool { return v >= 1 }},
		{"b", b, `dsslock_sskv_request_duration_seconds_count{verb="SET"}`, func(v float64) bool { return v >= 2 }},
		{"a", a, `dsslock_sskv_connected`, func(v float64) bool { return v == 1 }},
		{"a", a, `dsslock_sskv_connections_total`, func(v float64) bool { return v == 1 }},
		{"b", b, `dsslock_leader_leaderless_seconds_count{election="orders/leader"}`, func(v float64) bool { return v >= 1 }},
	} {
		if got := c.cd.scrape(t, c.series); !c.want(got) {
			t.Errorf("%s: %s = %v", c.who, c.series, got)
		}
	}
	// The locks renew every 100 ms: their renewals show.
	deadline := time.Now().Add(10 * time.Second)
	for b.scrape(t, `dsslock_lock_renewal_duration_seconds_count{lock="jobs/b"}`) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no lock renewal scraped")
		}
		time.Sleep(20 * time.Millisecond) // polling a scrape: there is nothing to wait on
	}
}
