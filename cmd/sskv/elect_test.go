package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// tokenPattern matches a fencing token as sskv prints it.
const tokenPattern = `(\d{15}:\d{5}:statestore)`

var campaigning = regexp.MustCompile(`(?m)^campaigning in svc \(Ctrl-C to stop\)\n`)

// sskvProc is sskv running as a process of its own (the test binary, with
// SSKV_TEST_MAIN=1), for tests that signal it.
type sskvProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	exited         chan struct{} // closed once the process has exited
}

// startSSKV starts sskv with args. The process is killed, if still running,
// when the test ends.
func startSSKV(t *testing.T, args ...string) *sskvProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &sskvProc{cmd: exec.Command(self, args...), stdout: newSyncBuffer(), stderr: newSyncBuffer(), exited: make(chan struct{})}
	// Under -race, a process sleeps 1 s at exit (GORACE atexit_sleep_ms):
	// not here, where the tests wait for exits.
	p.cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *sskvProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// exitCode waits for the process to exit and returns its exit status.
func (p *sskvProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(20 * time.Second):
		t.Fatalf("sskv %q has not exited; stdout %q, stderr %q", p.cmd.Args[1:], p.stdout, p.stderr)
		return 0
	}
}

func (p *sskvProc) wantExit(t *testing.T, code int, stderrPart string) {
	t.Helper()
	if got := p.exitCode(t); got != code || !strings.Contains(p.stderr.String(), stderrPart) {
		t.Fatalf("sskv %q exited %d, stderr %q; want %d and stderr containing %q", p.cmd.Args[1:], got, p.stderr, code, stderrPart)
	}
}

func parseToken(t *testing.T, s string) hlc.Timestamp {
	t.Helper()
	tok, err := hlc.Parse(s)
	if err != nil {
		t.Fatalf("token %q: %v", s, err)
	}
	return tok
}

// Two candidates and an observer: one candidate leads, the other waits;
// SIGTERM to the leader makes it resign and exit 0, and the other takes
// over at once, not after the TTL; the observer prints each change in
// order.
func TestElectHandover(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	elect := func(args ...string) *sskvProc {
		return startSSKV(t, append([]string{"-addr", srv.Addr(), "elect"}, args...)...)
	}
	obs := elect("-l", "svc")
	obs.stdout.WaitFor(t, regexp.MustCompile(`^none\n`))
	obs.stderr.WaitFor(t, regexp.MustCompile(`^observing svc \(Ctrl-C to stop\)\n$`))

	cands := map[string]*sskvProc{"one": elect("svc", "one"), "two": elect("svc", "two")}
	for _, p := range cands {
		p.stderr.WaitFor(t, campaigning)
	}
	m := obs.stdout.WaitFor(t, regexp.MustCompile(`^none\nleader (one|two) `+tokenPattern+`\n`))
	first, token1 := m[1], parseToken(t, m[2])
	second := map[string]string{"one": "two", "two": "one"}[first]
	cands[first].stdout.WaitFor(t, regexp.MustCompile(`^leader `+first+` `+regexp.QuoteMeta(m[2])+`\n$`))
	if out := cands[second].stdout.String(); out != "" {
		t.Fatalf("both candidates lead: %s printed %q", second, out)
	}

	start := time.Now()
	cands[first].signal(t, syscall.SIGTERM)
	cands[first].wantExit(t, exitOK, "")
	m = cands[second].stdout.WaitFor(t, regexp.MustCompile(`^leader `+second+` `+tokenPattern+`\n$`))
	// The TTL is 10 s: a takeover this soon follows the resignation.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%s took over %v after %s was told to resign", second, d, first)
	}
	if token2 := parseToken(t, m[1]); !token2.After(token1) {
		t.Errorf("the second term's token %v is not after the first's %v", token2, token1)
	}
	if got := cands[first].stderr.String(); got != "campaigning in svc (Ctrl-C to stop)\n" {
		t.Errorf("the resigned leader's stderr: %q", got)
	}

	cands[second].signal(t, syscall.SIGINT)
	cands[second].wantExit(t, exitOK, "")
	q := regexp.QuoteMeta
	want := "none\nleader " + first + " " + token1.String() + "\nnone\nleader " + second + " " + m[1] + "\nnone\n"
	obs.stdout.WaitFor(t, regexp.MustCompile(`^`+q(want)+`$`))
	obs.signal(t, syscall.SIGTERM)
	obs.wantExit(t, exitOK, "")
	if got := obs.stdout.String(); got != want {
		t.Errorf("the observer printed %q; want %q", got, want)
	}
	sskvRun(t, "-addr", srv.Addr(), "get", "svc").want(t, exitNotMet, "", "NOT FOUND")
}

// A candidate of a higher priority that joins takes over from the leader
// at once (the TTL is 10 s): the leader says it handed over and exits 0,
// and a waiting candidate of a lower priority stays behind.
func TestElectPriority(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	elect := func(args ...string) *sskvProc {
		return startSSKV(t, append([]string{"-addr", srv.Addr(), "elect"}, args...)...)
	}
	low := elect("-priority", "1", "svc", "low")
	m := low.stdout.WaitFor(t, regexp.MustCompile(`^leader low `+tokenPattern+`\n$`))
	token1 := parseToken(t, m[1])
	plain := elect("svc", "plain")
	plain.stderr.WaitFor(t, campaigning)

	start := time.Now()
	high := elect("-priority", "2", "svc", "high")
	m = high.stdout.WaitFor(t, regexp.MustCompile(`^leader high `+tokenPattern+`\n$`))
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("high took over %v after it started", d)
	}
	if token2 := parseToken(t, m[1]); !token2.After(token1) {
		t.Errorf("high's token %v is not after low's %v", token2, token1)
	}
	low.wantExit(t, exitOK, "handed over")
	if out := plain.stdout.String(); out != "" {
		t.Fatalf("the plain candidate led: %q", out)
	}
	high.signal(t, syscall.SIGTERM)
	high.wantExit(t, exitOK, "")
	plain.stdout.WaitFor(t, regexp.MustCompile(`^leader plain `))
	plain.signal(t, syscall.SIGTERM)
	plain.wantExit(t, exitOK, "")
}

// A leader asked to hand over by a candidate process of a higher priority
// that is then killed (kill -9) before the handover: the reservation for
// it expires, and an ordinary election follows within about a TTL; the
// killed candidate never leads.
func TestElectTransferToKilledCandidate(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const ttl = time.Second
	term, err := leader.Campaign(ctx, dialStore(t, srv.Addr()), "svc", []byte("low"),
		leader.WithTTL(ttl), leader.WithPriority(1), leader.WithCandidateID("low"))
	if err != nil {
		t.Fatal(err)
	}
	plain := startSSKV(t, "-addr", srv.Addr(), "elect", "-ttl", "1s", "svc", "plain")
	plain.stderr.WaitFor(t, campaigning)
	high := startSSKV(t, "-addr", srv.Addr(), "elect", "-ttl", "1s", "-priority", "2", "svc", "high")
	select {
	case <-term.Context().Done():
	case <-ctx.Done():
		t.Fatal("the leader was not asked to hand over")
	}
	if cause := context.Cause(term.Context()); !errors.Is(cause, leader.ErrTransferred) || term.Err() != nil {
		t.Fatalf("the leader's context ended with %v (Err %v); want ErrTransferred while leading", cause, term.Err())
	}
	if err := high.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-high.exited

	start := time.Now()
	if err := term.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	plain.stdout.WaitFor(t, regexp.MustCompile(`^leader plain `+tokenPattern+`\n$`))
	d := time.Since(start)
	t.Logf("plain leads %v after the handover to the killed candidate", d)
	if d < ttl/2 || d > 5*ttl {
		t.Errorf("plain led %v after the handover; want about the TTL (%v), when the reservation expires", d, ttl)
	}
	if out := high.stdout.String(); out != "" {
		t.Errorf("the killed candidate printed %q", out)
	}
	plain.signal(t, syscall.SIGTERM)
	plain.wantExit(t, exitOK, "")
}

// A candidate interrupted while it campaigns exits 1 and leaves nothing
// behind; the leader is not disturbed.
func TestElectInterruptedCampaign(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	leaderProc := startSSKV(t, "-addr", srv.Addr(), "elect", "svc", "one")
	m := leaderProc.stdout.WaitFor(t, regexp.MustCompile(`^leader one `+tokenPattern+`\n$`))
	waiting := startSSKV(t, "-addr", srv.Addr(), "elect", "svc", "two")
	waiting.stderr.WaitFor(t, campaigning)
	waiting.signal(t, syscall.SIGINT)
	waiting.wantExit(t, exitError, `sskv: elect "svc": interrupted while campaigning`)
	if out := waiting.stdout.String(); out != "" {
		t.Errorf("the interrupted candidate printed %q", out)
	}

	c := dialStore(t, srv.Addr())
	s, err := leader.Leader(context.Background(), c, "svc")
	if err != nil || string(s.Value) != "one" || s.Token.String() != m[1] {
		t.Fatalf("after the interruption, the leader is %+v, %v; want one's term %s", s, err, m[1])
	}
	leaderProc.signal(t, syscall.SIGTERM)
	leaderProc.wantExit(t, exitOK, "")
	sskvRun(t, "-addr", srv.Addr(), "get", "svc").want(t, exitNotMet, "", "NOT FOUND")
}

// A leader whose renewals stop reaching the store (a frozen connection)
// gives up its term on its own clock: it exits 4 with the reason, and the
// other candidate takes over once the key expires.
func TestElectLostRenewDeadline(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })

	first := startSSKV(t, "-addr", proxy.Addr(), "elect", "-ttl", "600ms", "svc", "one")
	m := first.stdout.WaitFor(t, regexp.MustCompile(`^leader one `+tokenPattern+`\n$`))
	token1 := parseToken(t, m[1])
	second := startSSKV(t, "-addr", srv.Addr(), "elect", "-ttl", "600ms", "svc", "two")
	second.stderr.WaitFor(t, campaigning)

	proxy.Blackhole()
	first.wantExit(t, exitLost, `sskv: elect "svc": leadership lost: renew deadline passed`)
	m = second.stdout.WaitFor(t, regexp.MustCompile(`^leader two `+tokenPattern+`\n$`))
	if token2 := parseToken(t, m[1]); !token2.After(token1) {
		t.Errorf("the second term's token %v is not after the first's %v", token2, token1)
	}
	second.signal(t, syscall.SIGTERM)
	second.wantExit(t, exitOK, "")
}

// A leader whose key a newer term has written (here an intruder, with a
// newer fencing token) learns it at its next renewal and exits 4; the
// intruder's key stays.
func TestElectLostToNewerTerm(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	p := startSSKV(t, "-addr", srv.Addr(), "elect", "-ttl", "1s", "svc", "one")
	p.stdout.WaitFor(t, regexp.MustCompile(`^leader one `+tokenPattern+`\n$`))

	c := dialStore(t, srv.Addr())
	ctx := context.Background()
	res, err := c.Set(ctx, "other", []byte("x"), sskv.SetOptions{}) // a token newer than the term's
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "svc", []byte("intruder"), sskv.SetOptions{FencingToken: res.Version}); err != nil {
		t.Fatal(err)
	}
	p.wantExit(t, exitLost, `sskv: elect "svc": leadership lost: `)
	if got, err := c.Get(ctx, "svc"); err != nil || string(got.Value) != "intruder" {
		t.Fatalf("after the loss, svc = %+v, %v; want the intruder's", got, err)
	}
}

func TestElectBadUsage(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"elect"}, "sskv: elect: missing arguments"},
		{[]string{"elect", "svc"}, "sskv: elect: missing PROPOSAL"},
		{[]string{"elect", "svc", "a", "b"}, `sskv: elect: too many arguments ["b"]`},
		{[]string{"elect", "", "a"}, "NAME must not be empty"},
		{[]string{"elect", "-l", "svc", "a"}, "-l observes: give NAME only"},
		{[]string{"elect", "-l", "-ttl", "10s", "svc"}, "-ttl is for a candidate"},
		{[]string{"elect", "-l", "-priority", "1", "svc"}, "-priority is for a candidate"},
		{[]string{"elect", "-priority", "-1", "svc", "a"}, "-priority -1: must be 0 or more"},
		{[]string{"elect", "-priority", "high", "svc", "a"}, `invalid value "high" for flag -priority`},
		{[]string{"elect", "-ttl", "0", "svc", "a"}, "-ttl 0s: must be a positive whole number of milliseconds"},
		{[]string{"elect", "-ttl", "-1s", "svc", "a"}, "-ttl -1s: must be a positive"},
		{[]string{"elect", "-ttl", "1500us", "svc", "a"}, "-ttl 1.5ms: must be a positive whole number of milliseconds"},
		{[]string{"elect", "-ttl", "soon", "svc", "a"}, `invalid value "soon" for flag -ttl`},
		// Whole milliseconds, but too short for renewals to get their
		// answers in time: refused before connecting.
		{[]string{"-addr", srv.Addr(), "elect", "-ttl", "2ms", "svc", "a"}, "sskv: elect: -ttl 2ms: must be at least 100ms"},
		{[]string{"elect", "-ttl", "10", "svc", "a"}, `invalid value "10" for flag -ttl: missing unit: write 10s or 10ms`},
	} {
		o := sskvRun(t, tc.args...)
		if o.code != exitUsage || o.stdout != "" || !strings.Contains(o.stderr, tc.want) || !strings.Contains(strings.ToLower(o.stderr), "usage") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and usage with %q", tc.args, o.code, o.stdout, o.stderr, tc.want)
		}
	}
}

func TestElectHelp(t *testing.T) {
	o := sskvRun(t, "help", "elect")
	for _, w := range []string{"sskv [connection flags] elect [-ttl DURATION] [-priority N] NAME PROPOSAL | -l NAME", "leader PROPOSAL TOKEN", "none", "status 4", "-ttl", "-priority N", "handed over"} {
		if o.code != exitOK || !strings.Contains(o.stdout, w) {
			t.Errorf("help elect: exit %d; the help does not mention %q:\n%s", o.code, w, o.stdout)
		}
	}
	if o := sskvRun(t, "-h"); !strings.Contains(o.stdout, "  elect   ") || !strings.Contains(o.stdout, "elect: 4 if leadership was lost") {
		t.Errorf("sskv -h does not list elect:\n%s", o.stdout)
	}
}

func TestStateLine(t *testing.T) {
	tok := hlc.Timestamp{Wall: 1735787045006, Counter: 2, Node: "statestore"}
	for _, tc := range []struct {
		s    leader.State
		want string
	}{
		{leader.State{}, "none\n"},
		{leader.State{Resync: true}, "none (resync)\n"},
		{leader.State{ID: "c/1", Value: []byte("10.0.0.5:8080"), Token: tok}, "leader 10.0.0.5:8080 001735787045006:00002:statestore\n"},
		{leader.State{ID: "c/1", Value: []byte("a b"), Token: tok, Resync: true}, `leader "a b" 001735787045006:00002:statestore (resync)` + "\n"},
		{leader.State{ID: "c/1", Token: tok}, `leader "" 001735787045006:00002:statestore` + "\n"},
	} {
		if got := stateLine(tc.s); got != tc.want {
			t.Errorf("stateLine(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// dialStore connects a client to addr, closed when the test ends.
func dialStore(t *testing.T, addr string) *sskv.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
