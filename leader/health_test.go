package leader_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
)

// The store becomes unreachable while a candidate leads: its term ends on
// its own clock, its work returns at once, and only the resign is left,
// waiting for the store. The health check must stay healthy all that time:
// nothing acts as leader. (It used to answer 503, "the term ended ... and
// its work has not returned", for seconds, and an orchestrator would have
// killed a healthy process.)
func TestHealthWhileResignPending(t *testing.T) {
	srv := startStore(t)
	proxy := proxied(t, srv.Addr())
	c := dial(t, proxy.Addr())
	const ttl = 3 * time.Second
	started := make(chan *leader.Term, 1)
	stopped := make(chan error, 1)
	returned := make(chan struct{})
	e, err := leader.NewElector(c, "e", []byte("a"), leader.WithTTL(ttl),
		leader.WithHealthTolerance(100*time.Millisecond), // strict, so a false alarm would show
		leader.OnStartedLeading(func(t *leader.Term) { started <- t }),
		leader.OnStoppedLeading(func(err error) { stopped <- err }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- e.Run(ctx, func(ctx context.Context, _ *leader.Term) error {
			<-ctx.Done()
			close(returned)
			return ctx.Err()
		})
	}()
	term := <-started
	health := httptest.NewServer(e)
	defer health.Close()

	proxy.Blackhole() // the store is unreachable from now on
	<-term.Done()
	<-returned
	ended := time.Now()
	if !errors.Is(term.Err(), lock.ErrRenewDeadline) {
		t.Fatalf("term ended with %v; want the renew deadline", term.Err())
	}
	// Until Run has resigned (OnStoppedLeading), and for a while after,
	// the check must say healthy.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var polls, pending int
	for done := false; !done; {
		select {
		case err := <-stopped:
			if !errors.Is(err, leader.ErrLost) {
				t.Errorf("OnStoppedLeading(%v); want ErrLost", err)
			}
			done = true
		case <-tick.C:
		}
		code, body := getBody(t, health.URL)
		polls++
		if code != http.StatusOK {
			t.Fatalf("healthz = %d %q %v after the term ended, with its work returned", code, body, time.Since(ended))
		}
		if strings.Contains(body, "resign is waiting") {
			pending++
		}
		if err := e.Check(); err != nil {
			t.Fatalf("Check = %v with the work returned", err)
		}
	}
	t.Logf("healthy in %d polls over %v after the term ended; %d while the resign waited", polls, time.Since(ended).Round(time.Millisecond), pending)
	if e.Leading() {
		t.Fatal("Leading() after the term ended")
	}
	proxy.Heal()
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
}

func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
