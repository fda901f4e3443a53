package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func init() {
	// Under -race, a process sleeps 1 s at exit (GORACE atexit_sleep_ms):
	// not the supervisors that "sskv lock" starts in these tests, which are
	// this test binary too, nor anything else the tests start.
	os.Setenv("GORACE", os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// running reports whether the process pid runs (is not a zombie) with
// DSSLOCK_TOKEN=token in its environment: a process of the holding whose
// token that is, not another that took its number since.
func running(pid int, token string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ") // empty for a zombie
	return err == nil && slices.Contains(strings.Split(string(env), "\x00"), envToken+"="+token)
}

// The processes a command wrote to a file: "PID... TOKEN".
func readPIDs(t *testing.T, line string) (pids []int, token string) {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 2 {
		t.Fatalf("pids line %q: want PID... TOKEN", line)
	}
	for _, s := range f[:len(f)-1] {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("pids line %q: %v", line, err)
		}
		pids = append(pids, pid)
	}
	return pids, f[len(f)-1]
}

// killAtEnd kills, when the test ends, those of pids that still run with
// token: after a failure, no process of a command outlives the test.
func killAtEnd(t *testing.T, pids []int, token string) {
	t.Cleanup(func() {
		for _, pid := range pids {
			if running(pid, token) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// wantFree fails the test unless the key is missing (the lock released).
func wantFree(t *testing.T, addr, key string) {
	t.Helper()
	if o := sskvRun(t, "-addr", addr, "get", key); o.code != exitNotMet {
		t.Fatalf("get %s: exit %d, stdout %q, stderr %q; want %d: no key", key, o.code, o.stdout, o.stderr, exitNotMet)
	}
}

// fifo makes a named pipe in a new directory, for a command to tell the
// test that it has started: the test's read waits for the command's write.
func fifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readFIFO reads the first line written to the named pipe path.
func readFIFO(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path) // waits for the writer
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return strings.TrimSpace(line)
}

// A contender of TestLockKill9EndsCommandTree: "sskv lock", as a process.
type contender struct {
	id     string
	cmd    *exec.Cmd
	stderr *syncBuffer
	gone   chan struct{} // closed at the end of its stdout: sskv, its supervisor and every process of the command have exited
}

// kill -9 of the sskv that holds the lock, round after round, with other
// sskv waiting for the lock: the command it ran, and a worker the command
// started, are gone before the next holder's command starts, and no two
// commands ever run at once.
func TestLockKill9EndsCommandTree(t *testing.T) {
	const (
		rounds      = 24
		contenders  = 3
		ttl         = "600ms" // a round takes about one TTL: the next holder waits for the key to expire
		roundsLimit = 30 * time.Second
	)
	srv := startStore(t, localstore.Config{})
	dir := t.TempDir()
	journal, pids := filepath.Join(dir, "journal"), filepath.Join(dir, "pids")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Buffered: no contender waits for the test to read.
	started, ended := make(chan string, 1000), make(chan string, 1000)
	all := map[string]*contender{}
	start := func() {
		c := &contender{id: "c" + strconv.Itoa(len(all)), stderr: newSyncBuffer(), gone: make(chan struct{})}
		all[c.id] = c
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		c.cmd = exec.Command(self, "-addr", srv.Addr(), "lock", "-ttl", ttl, "jobs/k9", "--", "sh", "-c", journalScript, journal, c.id, pids)
		c.cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1")
		c.cmd.Stdout, c.cmd.Stderr = w, c.stderr
		err = c.cmd.Start()
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.cmd.Wait() }()
		go func() {
			defer func() { close(c.gone); ended <- c.id }()
			defer r.Close()
			for sc := bufio.NewScanner(r); sc.Scan(); {
				if sc.Text() == "started "+c.id {
					started <- c.id
				}
			}
		}()
	}
	killed := map[string]bool{}
	t.Cleanup(func() {
		for _, c := range all {
			_ = c.cmd.Process.Kill()
		}
		for _, c := range all {
			select {
			case <-c.gone:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: the processes of sskv were not gone 10 s after kill -9; stderr %q", c.id, c.stderr)
			}
		}
	})
	for range contenders {
		start()
	}

	var goneAfter, handover []time.Duration // from each kill -9
	var lastKill time.Time
	for len(goneAfter) < rounds {
		var c *contender
		select {
		case id := <-started:
			c = all[id]
		case id := <-ended:
			if !killed[id] {
				// It lost the lock by itself (a machine too busy to
				// renew in time): not a round; a new one takes its
				// place.
				t.Logf("%s ended by itself: stderr %q", id, all[id].stderr)
				start()
			}
			continue
		case <-time.After(roundsLimit):
			t.Fatalf("no command started within %v; journal:\n%s", roundsLimit, readJournal(t, journal))
		}
		if !lastKill.IsZero() {
			handover = append(handover, time.Since(lastKill))
		}
		// A check of the check: the command and its worker run now.
		b, err := os.ReadFile(pids)
		if err != nil {
			t.Fatal(err)
		}
		ps, tok := readPIDs(t, string(b))
		killAtEnd(t, ps, tok)
		if len(ps) != 2 {
			t.Fatalf("pids %q: want the command's and the worker's", b)
		}
		if !running(ps[0], tok) || !running(ps[1], tok) {
			// Unless c lost the lock by itself meanwhile (then ended
			// will tell).
			if !strings.Contains(c.stderr.String(), "lost") {
				t.Fatalf("%s: the processes of its command do not run (%q)", c.id, b)
			}
			continue
		}
		lastKill = time.Now()
		killed[c.id] = true
		if err := c.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatal(err)
		}
		select {
		case <-c.gone:
			goneAfter = append(goneAfter, time.Since(lastKill))
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: its command's processes still hold its stdout 10 s after kill -9 of sskv", c.id)
		}
		for _, pid := range ps {
			if running(pid, tok) {
				t.Fatalf("%s: process %d of its command still runs after kill -9 of sskv", c.id, pid)
			}
		}
		if len(goneAfter) < rounds {
			start()
		}
	}
	t.Logf("%d rounds of kill -9 of the holder (TTL %s, %d contenders):", rounds, ttl, contenders)
	t.Logf("  command's tree gone after kill -9: %s", durationStats(goneAfter))
	t.Logf("  next command started after kill -9: %s", durationStats(handover))

	checkJournal(t, journal, rounds)
}

// journalScript is the command of the contenders in
// TestLockKill9EndsCommandTree and TestLockStoppedEndsCommandTree, run with
// the arguments JOURNAL ID PIDS: it writes "start TOKEN" to the journal,
// starts a worker that writes "beat TOKEN" every 10 ms, writes the PIDs of
// both and its token to the file PIDS, and "started ID" on stdout. Each line
// of the journal is one write(2) to a file opened with O_APPEND: the
// journal's order is the order of the writes. The holder before must be
// gone when a command starts: it writes "alive PID TOKEN" if it is not.
const journalScript = `j=$0 id=$1 pids=$2
if [ -s "$pids" ]; then
	read p w tok < "$pids"
	for x in $p $w; do
		if tr '\0' '\n' 2>/dev/null < /proc/$x/environ | grep -qx "DSSLOCK_TOKEN=$tok"; then
			echo "alive $x $tok" >> "$j"
		fi
	done
fi
echo "start $DSSLOCK_TOKEN" >> "$j"
(while :; do echo "beat $DSSLOCK_TOKEN" >> "$j"; sleep 0.01; done) &
echo "$$ $! $DSSLOCK_TOKEN" > "$pids"
echo "started $id"
wait`

// checkJournal checks the journal of journalScript's commands: each
// command's beats come between its start and the next command's start, no
// command found the one before still running, and at least rounds commands
// started.
func checkJournal(t *testing.T, journal string, rounds int) {
	t.Helper()
	data := readJournal(t, journal)
	var cur hlc.Timestamp
	starts := 0
	for i, line := range strings.Split(strings.TrimSpace(data), "\n") {
		word, arg, _ := strings.Cut(line, " ")
		switch word {
		case "start":
			tok, err := hlc.Parse(arg)
			if err != nil || !tok.After(cur) {
				t.Fatalf("line %d %q: token not after %v (%v)", i+1, line, cur, err)
			}
			cur = tok
			starts++
		case "beat":
			if arg != cur.String() {
				t.Fatalf("line %d %q: a beat of a command other than the last started (%v): two commands at once", i+1, line, cur)
			}
		default:
			t.Fatalf("line %d %q: the command before was still running when the next started", i+1, line)
		}
	}
	if starts < rounds {
		t.Fatalf("%d commands started; want at least %d", starts, rounds)
	}
}

func readJournal(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// durationStats sums up ds: min, median and max.
func durationStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v, median %v, max %v (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

// A lock lost while the command runs: SIGTERM reaches every process of the
// command, SIGKILL those that ignore it, and sskv returns only once all are
// gone: the command, a worker in a session of its own, and an orphan (whose
// parent exited). TTL 1200ms: the watchdog's timeout (TTL/4) is then
// longer than the stalls of this test process, which is sskv here, under
// -race on a busy machine.
func TestLockLostEndsWholeTree(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	cue := fifo(t)
	// The worker and the orphan leave sskv's output, so that sskv does not
	// wait for them to close it. The worker writes the cue once it runs
	// (a process that has just forked or is in exec shows no environment
	// in /proc for a moment); the orphan is a subshell, which does not
	// exec.
	script := `trap '' TERM
( (while :; do sleep 0.01; done) >/dev/null 2>&1 & echo $! > "$0.orphan" ); read o < "$0.orphan"
setsid sh -c 'echo "$1 $$ $2 $DSSLOCK_TOKEN" > "$0"; while :; do sleep 0.01; done' "$0" $$ "$o" >/dev/null 2>&1 &
wait`
	done := make(chan outcome, 1)
	go func() {
		done <- sskvRun(t, "-addr", srv.Addr(), "lock", "-ttl", "1200ms", "l", "--", "sh", "-c", script, cue)
	}()
	ps, tok := readPIDs(t, readFIFO(t, cue))
	killAtEnd(t, ps, tok)
	for _, pid := range ps {
		if !running(pid, tok) {
			t.Fatalf("process %d of the command does not run", pid)
		}
	}
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(context.Background(), "l", []byte("intruder"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	var o outcome
	select {
	case o = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("sskv has not returned 20 s after the loss")
	}
	o.want(t, exitLost, "", `sskv: lock "l" lost: held by another holder`)
	if !strings.Contains(o.stderr, "still running 400ms after SIGTERM") {
		t.Errorf("stderr %q: no word of the kill after the grace", o.stderr)
	}
	for _, pid := range ps {
		if running(pid, tok) {
			t.Errorf("process %d of the command still runs after sskv returned", pid)
		}
	}
}

// A command that exits and leaves processes running: they get SIGTERM, then
// SIGKILL if they ignore it, and the lock is released only after. (TTL
// 1200ms: see TestLockLostEndsWholeTree.)
func TestLockEndsWhatCommandLeft(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	pids := filepath.Join(t.TempDir(), "pids")
	// They leave sskv's output, so that sskv does not wait for them to
	// close it.
	script := `exec >/dev/null 2>&1; sleep 300 & a=$!; trap '' TERM; sleep 300 & echo "$a $! $DSSLOCK_TOKEN" > "$0"`
	o := sskvRun(t, "-addr", srv.Addr(), "lock", "-ttl", "1200ms", "l", "--", "sh", "-c", script, pids)
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	ps, tok := readPIDs(t, string(b))
	killAtEnd(t, ps, tok)
	o.want(t, exitOK, "", "sskv: sh exited, leaving 2 processes running: sent them SIGTERM\n"+
		"sskv: 1 process still running 400ms after SIGTERM: sent SIGKILL\n")
	for _, pid := range ps {
		if running(pid, tok) {
			t.Errorf("process %d, left by the command, still runs after sskv returned", pid)
		}
	}
	wantFree(t, srv.Addr(), "l")
}

// SIGINT to sskv reaches COMMAND through the supervisor, as SIGTERM does
// (TestLockPassesSignalsOn).
func TestLockPassesInterruptOn(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	cue := fifo(t)
	p := startSSKV(t, "-addr", srv.Addr(), "lock", "l", "--", "sh", "-c", `trap 'exit 5' INT; echo up > "$0"; while :; do sleep 0.01; done`, cue)
	readFIFO(t, cue)
	p.signal(t, syscall.SIGINT)
	p.wantExit(t, 5, "")
	wantFree(t, srv.Addr(), "l")
}

// A COMMAND that cannot be run is reported as before the supervisor: an
// error of sskv, with the lock's name.
func TestLockCommandNotExecutable(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	f := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sskvRun(t, "-addr", srv.Addr(), "lock", "l", "--", f).want(t, exitError, "", `sskv: lock "l": exec: "`+f+`": permission denied`)
	wantFree(t, srv.Addr(), "l")
}

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want procStat
		ok   bool
	}{
		{"42 (sh) S 7 42 42 0 -1", procStat{ppid: 7}, true},
		{"42 (a) b (c) Z 1 0", procStat{ppid: 1, zombie: true}, true},
		{"42 () X 3", procStat{ppid: 3, zombie: true}, true},
		{"42 (sh S 7", procStat{}, false},
		{"42 (sh) S", procStat{}, false},
		{"42 (sh) S x", procStat{}, false},
		{"", procStat{}, false},
	} {
		got, err := parseStat([]byte(tc.in))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("42 (sh) S 7 42 42 0 -1"))
	f.Add([]byte("1 ()) ) R 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseStat(b) // an error, never a panic
	})
}
