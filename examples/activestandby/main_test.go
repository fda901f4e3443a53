package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait: a passing test never waits this long.
const waitTimeout = 20 * time.Second

// replica is one instance of the service, run in-process by run.
type replica struct {
	id     string
	log    *logBuffer
	http   string // the address of its /healthz and /status
	cancel context.CancelFunc
	done   chan error
	once   sync.Once // stops it
}

// startReplica runs a replica against the store at addr until the test
// ends or stop is called.
func startReplica(t *testing.T, addr, id string, ttl time.Duration) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{id: id, log: newLogBuffer(), cancel: cancel, done: make(chan error, 1)}
	log := slog.New(slog.NewTextHandler(r.log, nil))
	args := []string{"-addr", addr, "-id", id, "-ttl", ttl.String(), "-http", "127.0.0.1:0"}
	go func() { r.done <- run(ctx, args, log) }()
	t.Cleanup(func() { r.stop(t) })
	r.http = r.log.waitFor(t, `msg="serving /healthz and /status" id=`+id+` addr=(\S+)`)[1]
	return r
}

// stop cancels the replica's context and waits for run to return nil.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("replica %s: run returned %v", r.id, err)
			}
		case <-time.After(waitTimeout):
			t.Fatalf("replica %s: run did not return after its context ended; log:\n%s", r.id, r.log)
		}
	})
}

type status struct {
	ID      string `json:"id"`
	Leading bool   `json:"leading"`
	Leader  string `json:"leader"`
	Token   string `json:"token"`
}

// get fetches path from the replica's HTTP server.
func (r *replica) get(t *testing.T, path string) (int, []byte) {
	t.Helper()
	client := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + r.http + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

func (r *replica) status(t *testing.T) status {
	t.Helper()
	code, body := r.get(t, "/status")
	var s status
	if err := json.Unmarshal(body, &s); code != http.StatusOK || err != nil {
		t.Fatalf("replica %s: /status answered %d %q (%v)", r.id, code, body, err)
	}
	return s
}

func (r *replica) wantHealthy(t *testing.T) {
	t.Helper()
	if code, body := r.get(t, "/healthz"); code != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("replica %s: /healthz answered %d %q; want 200 ok", r.id, code, body)
	}
}

// workDone waits for the replica's first "work done" and returns the
// counter it wrote.
func (r *replica) workDone(t *testing.T) int {
	t.Helper()
	n, _ := strconv.Atoi(r.log.waitFor(t, `msg="work done" id=`+r.id+` counter=(\d+) `)[1])
	return n
}

// One replica is active, the other waits; the active one, stopped, resigns
// and the other takes over at once and goes on with the counter.
func TestFailoverOnStop(t *testing.T) {
	srv := startStore(t)
	a := startReplica(t, srv.Addr(), "a", 5*time.Second)
	a.log.waitFor(t, `msg=elected id=a `)
	b := startReplica(t, srv.Addr(), "b", 5*time.Second)
	b.log.waitFor(t, `msg="new leader" id=b leader=a `)

	sa, sb := a.status(t), b.status(t)
	if !sa.Leading || sb.Leading || sa.Leader != "a" || sb.Leader != "a" || sa.Token == "" || sa.Token != sb.Token {
		t.Fatalf("want a active and b standby, both seeing a lead; got %+v and %+v", sa, sb)
	}
	a.wantHealthy(t)
	b.wantHealthy(t)
	if n := a.workDone(t); n != 1 {
		t.Errorf("a's first work wrote counter %d; want 1", n)
	}

	// Stopped now, a is not writing: its next write is a second away.
	start := time.Now()
	a.stop(t)
	b.log.waitFor(t, `msg=elected id=b `)
	// The TTL is 5 s: a takeover this soon follows a's resignation.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("b took over %v after a was stopped", d)
	}
	if !b.status(t).Leading {
		t.Errorf("b does not report leading after its election")
	}
	b.wantHealthy(t)
	// b goes on from a's last value: a's work had returned before it
	// resigned, so nothing of a's lands after b's first write.
	last := a.log.lastMatch(`msg="work done" id=a counter=(\d+)`)
	if n := b.workDone(t); strconv.Itoa(n-1) != last {
		t.Errorf("b's first work wrote counter %d; a's last was %s", n, last)
	}
}

// A replica frozen off the network loses its term on its own clock, the
// other takes over once the key expires, and the frozen one, back, is a
// healthy standby: its work returned when its term ended.
func TestFailoverOnFreeze(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	const ttl = time.Second
	a := startReplica(t, proxy.Addr(), "a", ttl)
	a.log.waitFor(t, `msg=elected id=a `)
	b := startReplica(t, srv.Addr(), "b", ttl)
	b.log.waitFor(t, `msg="new leader" id=b leader=a `)

	proxy.Blackhole()
	start := time.Now()
	b.log.waitFor(t, `msg=elected id=b `)
	if d := time.Since(start); d > ttl+time.Second {
		t.Errorf("b took over %v after a was cut off; the TTL is %v", d, ttl)
	}
	a.log.waitFor(t, `msg="stopped leading" id=a reason="lock: lost: renew deadline passed`)
	// a reconnects (a new connection is not frozen) and campaigns again.
	a.log.waitFor(t, `msg="new leader" id=a leader=b `)
	if s := a.status(t); s.Leading || s.Leader != "b" {
		t.Errorf("a's status after the takeover: %+v; want a standby seeing b lead", s)
	}
	a.wantHealthy(t)
	b.wantHealthy(t)
	n := b.workDone(t)

	// The counter holds b's writes, fenced with b's token.
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Get(context.Background(), counterKey)
	if got, _ := strconv.Atoi(string(res.Value)); err != nil || got < n {
		t.Fatalf("get %s: %+v, %v; want at least b's %d", counterKey, res, err, n)
	}
}

func startStore(t *testing.T) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// logBuffer collects a replica's log; tests wait for the lines they expect.
type logBuffer struct{ *storetest.Output }

func newLogBuffer() *logBuffer { return &logBuffer{storetest.NewOutput()} }

func (b *logBuffer) waitFor(t *testing.T, pattern string) []string {
	t.Helper()
	return b.WaitFor(t, regexp.MustCompile(pattern))
}

func (b *logBuffer) lastMatch(pattern string) string {
	all := regexp.MustCompile(pattern).FindAllStringSubmatch(b.String(), -1)
	if len(all) == 0 {
		return ""
	}
	return all[len(all)-1][1]
}
