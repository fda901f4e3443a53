// Package storetest holds the fixtures that the tests of the packages built
// on sskv share: a local state store per test, clients dialled to it with
// fast reconnects, and bounded contexts.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// WaitTimeout bounds every wait of a test: a failing test waits this long,
// a passing one never does.
const WaitTimeout = 20 * time.Second

var seq atomic.Int64

// ID returns a client id unique to this test run, derived from the test's
// name.
func ID(t testing.TB) string {
	r := strings.NewReplacer("/", "-", ":", "-", " ", "_", "#", "-", "+", "-")
	return fmt.Sprintf("%s-%d", r.Replace(t.Name()), seq.Add(1))
}

// Start starts a local state store that is closed when the test ends.
func Start(t testing.TB) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatalf("localstore.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// Restart closes srv and, after down, starts a new local state store on the
// same address, closed when the test ends: as after a crash and restart of
// the broker, every key, session and watch is gone, and every client
// reconnects.
func Restart(t testing.TB, srv *localstore.Server, down time.Duration) *localstore.Server {
	t.Helper()
	addr := srv.Addr()
	_ = srv.Close()
	time.Sleep(down) // the outage itself, not a wait for a signal
	next, err := localstore.Start(localstore.Config{Addr: addr})
	if err != nil {
		t.Fatalf("restarting the store on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = next.Close() })
	return next
}

// Ctx returns a context that ends after WaitTimeout, or when the test ends.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// Dial connects a client to addr with fast reconnects; it is closed when
// the test ends.
func Dial(t testing.TB, addr string) *sskv.Client {
	t.Helper()
	return dial(t, sskv.Config{Addr: addr, ClientID: ID(t)})
}

// DialPatient is Dial for a client that does not give up on a silent
// connection for 30 s, so that a test that holds its traffic (a path that
// freezes) does not make it reconnect, and resend, by itself. id is its
// client id: ID(t) if empty.
func DialPatient(t testing.TB, addr, id string) *sskv.Client {
	t.Helper()
	if id == "" {
		id = ID(t)
	}
	return dial(t, sskv.Config{Addr: addr, ClientID: id, KeepAlive: 30 * time.Second, PingTimeout: 30 * time.Second})
}

func dial(t testing.TB, cfg sskv.Config) *sskv.Client {
	t.Helper()
	cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 100*time.Millisecond
	c, err := sskv.Dial(Ctx(t), cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Eventually polls cond until it holds, or fails the test after
// WaitTimeout. It is for state that has no event to wait on, such as the
// store's view of a client's watches or request count.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// ReportPercentiles reports the p50 and p99 of ds, in milliseconds, as the
// benchmark metrics "p50-"+unit and "p99-"+unit.
func ReportPercentiles(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-"+unit)
	b.ReportMetric(at(0.99), "p99-"+unit)
}

// Output collects what a program under test writes (its stdout, stderr or
// log), safe for concurrent use; a test waits for the lines it expects.
type Output struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

// NewOutput returns an empty Output.
func NewOutput() *Output { return &Output{changed: make(chan struct{})} }

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, err := o.buf.Write(p)
	close(o.changed)
	o.changed = make(chan struct{})
	return n, err
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// WaitFor waits until re matches what was written and returns the match
// and its submatches, or fails the test after WaitTimeout.
func (o *Output) WaitFor(t testing.TB, re *regexp.Regexp) []string {
	t.Helper()
	timer := time.NewTimer(WaitTimeout)
	defer timer.Stop()
	for {
		o.mu.Lock()
		m := re.FindStringSubmatch(o.buf.String())
		ch := o.changed
		o.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out waiting for %q; got:\n%s", re, o)
		}
	}
}

// DialSkewed connects a client as Dial does, whose hybrid logical clock
// reads the wall clock shifted by skew (nanoseconds), which the test may
// change at any time.
func DialSkewed(t testing.TB, addr string, skew *atomic.Int64) *sskv.Client {
	t.Helper()
	c, err := sskv.Dial(Ctx(t), sskv.Config{
		Addr:         addr,
		ClientID:     ID(t),
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 100 * time.Millisecond,
		WallClock:    func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Skew returns a clock skew of d for DialSkewed.
func Skew(d time.Duration) *atomic.Int64 {
	var s atomic.Int64
	s.Store(int64(d))
	return &s
}

// SkipInitial receives a new channel watcher's first event, the state the
// watch started from, for a test that looks only at the changes after it.
// It fails the test if that event is not the Initial one.
func SkipInitial(t testing.TB, w *sskv.Watcher) {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok || !ev.Initial {
			t.Fatalf("watch of %q: first event %+v (open %v); want the Initial one", w.Key(), ev, ok)
		}
	case <-time.After(WaitTimeout):
		t.Fatalf("watch of %q: no Initial event", w.Key())
	}
}
