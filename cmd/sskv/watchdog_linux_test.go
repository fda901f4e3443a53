package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// A contender of TestLockStoppedEndsCommandTree: "sskv lock", as a process.
type stopContender struct {
	id      string
	cmd     *exec.Cmd
	fifo    string // held open by every process of its command, for the test to see them all gone
	stderr  *syncBuffer
	exited  chan struct{} // closed once sskv has exited and its stderr is read
	running chan struct{} // closed when its command says it has run a while
}

// SIGSTOP of the sskv that holds the lock, round after round, with other
// sskv waiting for the lock: the stopped sskv can neither renew nor decide
// "lost", and the key expires; the supervisor's watchdog kills the command
// and its worker before the next holder's command starts, and no two
// commands ever run at once. The stopped sskv is left stopped until the
// next command has started (the lock expired under it), then resumed or
// killed, in turn.
func TestLockStoppedEndsCommandTree(t *testing.T) {
	const (
		rounds      = 12
		contenders  = 3
		ttl         = "1s" // the watchdog's timeout: 3/4 of TTL/3, 250ms
		roundsLimit = 30 * time.Second
	)
	srv := startStore(t, localstore.Config{})
	dir := t.TempDir()
	journal, pids := filepath.Join(dir, "journal"), filepath.Join(dir, "pids")
	// Its fd 7, read-write so that the open does not wait for a reader, is
	// inherited by all the command starts. It runs for a while ($4) after
	// it says it started, and before it says it runs: the SIGSTOP comes
	// then, so that it falls anywhere between two heartbeats, not only
	// before the first.
	script := "exec 7<>\"$3\"\n" + strings.Replace(journalScript, `echo "started $id"`, `echo "started $id"; sleep "$4"; echo "running $id"`, 1)
	if script == "exec 7<>\"$3\"\n"+journalScript {
		t.Fatal("journalScript has no line that says it started")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Buffered: no contender waits for the test to read.
	started, ended := make(chan string, 1000), make(chan string, 1000)
	all := map[string]*stopContender{}
	start := func() {
		c := &stopContender{id: "c" + strconv.Itoa(len(all)), stderr: newSyncBuffer(), exited: make(chan struct{}), running: make(chan struct{})}
		all[c.id] = c
		c.fifo = filepath.Join(dir, "fifo-"+c.id)
		if err := syscall.Mkfifo(c.fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		c.cmd = exec.Command(self, "-addr", srv.Addr(), "lock", "-ttl", ttl, "jobs/stop", "--", "sh", "-c", script, journal, c.id, pids, c.fifo,
			"0."+strconv.Itoa(len(all)*3%10)) // 0 to 0.9 s
		c.cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1")
		c.cmd.Stdout, c.cmd.Stderr = w, c.stderr
		err = c.cmd.Start()
		w.Close()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = c.cmd.Wait()
			close(c.exited)
			ended <- c.id
		}()
		go func() {
			defer r.Close()
			for sc := bufio.NewScanner(r); sc.Scan(); {
				switch sc.Text() {
				case "started " + c.id:
					started <- c.id
				case "running " + c.id:
					close(c.running)
				}
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range all {
			_ = c.cmd.Process.Kill() // a stopped process too
		}
		for _, c := range all {
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				t.Errorf("%s: sskv has not exited 10 s after kill -9; stderr %q", c.id, c.stderr)
			}
		}
	})
	for range contenders {
		start()
	}

	var (
		goneAfter, handover []time.Duration  // from each SIGSTOP
		stopped             []*stopContender // each round's
		asleep              bool             // the last of stopped is still stopped
		stoppedAt           time.Time
	)
	isStopped := func(id string) bool {
		for _, c := range stopped {
			if c.id == id {
				return true
			}
		}
		return false
	}
	// wake ends the pause of the sskv stopped last: SIGCONT in one round,
	// SIGKILL in the next.
	wake := func() {
		asleep = false
		c := stopped[len(stopped)-1]
		sig := syscall.SIGCONT
		if len(stopped)%2 == 0 {
			sig = syscall.SIGKILL
		}
		if err := c.cmd.Process.Signal(sig); errors.Is(err, os.ErrProcessDone) {
			// It ended before it could be woken (a SIGSTOP that came
			// after it exited on its own, on a busy machine): nothing to
			// wake; the journal's checks still judge the round.
			t.Logf("%s: %v: it had ended already; stderr %q", c.id, sig, c.stderr)
		} else if err != nil {
			t.Fatalf("%s: %v: %v", c.id, sig, err)
		}
	}
	for len(goneAfter) < rounds {
		var c *stopContender
		select {
		case id := <-started:
			c = all[id]
		case id := <-ended:
			if !isStopped(id) {
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
		if asleep {
			// The lock expired under the stopped sskv, and the next
			// holder's command runs.
			handover = append(handover, time.Since(stoppedAt))
			wake()
		}
		b, err := os.ReadFile(pids)
		if err != nil {
			t.Fatal(err)
		}
		ps, tok := readPIDs(t, string(b))
		killAtEnd(t, ps, tok)
		if len(ps) != 2 {
			t.Fatalf("pids %q: want the command's and the worker's", b)
		}
		// Nonblocking: a FIFO with no writer left (a command that
		// ended meanwhile) reads as its end at once.
		f, err := os.OpenFile(c.fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		treeGone := make(chan struct{})
		go func() {
			defer close(treeGone)
			defer f.Close()
			_, _ = io.Copy(io.Discard, f) // until no process of the command holds it
		}()
		if !running(ps[0], tok) || !running(ps[1], tok) {
			// Unless c lost the lock by itself meanwhile (then ended
			// will tell).
			if !strings.Contains(c.stderr.String(), "lost") {
				t.Fatalf("%s: the processes of its command do not run (%q)", c.id, b)
			}
			continue
		}
		select {
		case <-c.running:
		case id := <-ended:
			if id == c.id { // it lost the lock by itself: not a round
				t.Logf("%s ended by itself: stderr %q", id, c.stderr)
				start()
				continue
			}
			ended <- id // for the loop
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: its command has not said it runs within 10 s", c.id)
		}
		stoppedAt = time.Now()
		stopped, asleep = append(stopped, c), true
		if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		select {
		case <-treeGone:
			goneAfter = append(goneAfter, time.Since(stoppedAt))
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: its command's processes still run 10 s after SIGSTOP of sskv; journal:\n%s", c.id, readJournal(t, journal))
		}
		for _, pid := range ps {
			if running(pid, tok) {
				t.Fatalf("%s: process %d of its command still runs after its FIFO closed", c.id, pid)
			}
		}
		if len(goneAfter) < rounds {
			start()
		}
	}
	wake()
	t.Logf("%d rounds of SIGSTOP of the holder (TTL %s, %d contenders):", rounds, ttl, contenders)
	t.Logf("  command's tree gone after SIGSTOP: %s", durationStats(goneAfter))
	t.Logf("  next command started after SIGSTOP: %s", durationStats(handover))
	margin := make([]time.Duration, len(handover))
	for i := range handover {
		margin[i] = handover[i] - goneAfter[i]
	}
	t.Logf("  next command started after the tree was gone: %s", durationStats(margin))

	checkJournal(t, journal, rounds)
	// Each stopped sskv: the supervisor said why it killed the tree, and
	// the sskv resumed exited with status 4, as for a lost lock, without
	// releasing the next holder's lock (the journal would show two
	// commands at once).
	for i, c := range stopped {
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: sskv has not exited 10 s after SIGCONT or SIGKILL; stderr %q", c.id, c.stderr)
		}
		if !watchdogSaid.MatchString(c.stderr.String()) {
			t.Errorf("%s: stderr %q; want it to match %q", c.id, c.stderr, watchdogSaid)
		}
		if code := c.cmd.ProcessState.ExitCode(); i%2 == 0 && code != exitLost { // resumed
			t.Errorf("%s: resumed, exited %d; want %d (lost); stderr %q", c.id, code, exitLost, c.stderr)
		}
	}
}

var watchdogSaid = regexp.MustCompile(`(?m)^sskv: sskv lock stopped answering for 250ms \(paused\?\): killed sh's tree \(\d processes\) before its lock can expire$`)

// The watchdog does not kill a healthy command: a command that runs for 3
// TTLs (TTL 2s: the watchdog's timeout is 500ms, a heartbeat every 167ms)
// while two busy loops load the machine ends by itself, with status 0 and
// nothing on stderr.
func TestLockWatchdogSparesHealthyCommand(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	for range 2 {
		busy := exec.Command("sh", "-c", "while :; do :; done")
		if err := busy.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = busy.Process.Kill()
			_ = busy.Wait()
		})
	}
	begin := time.Now()
	o := sskvRun(t, "-addr", srv.Addr(), "lock", "-ttl", "2s", "l", "--", "sh", "-c", "sleep 6; echo done")
	t.Logf("ran for %v", time.Since(begin).Round(time.Millisecond))
	if strings.Contains(o.stderr, "stopped answering") {
		t.Fatalf("the watchdog killed a healthy command: exit %d, stderr %q", o.code, o.stderr)
	}
	// Anything else, such as the lock lost to a machine too busy to renew
	// it in time, fails too: the command must have run to its end.
	o.want(t, exitOK, "done\n", "")
	if o.stderr != "" {
		t.Fatalf("stderr %q; want nothing", o.stderr)
	}
	wantFree(t, srv.Addr(), "l")
}

// Ctrl-Z in a shell: SIGTSTP to sskv's process group, as the terminal sends
// it, stops sskv and COMMAND, which is in sskv's group, but not the
// supervisor, in a group of its own: its watchdog, fed no more heartbeats,
// kills COMMAND's tree before the lock can expire, and sskv, continued,
// exits 4 as for a lost lock.
func TestLockCtrlZEndsCommandTree(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	cue, held := fifo(t), fifo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// Every process of the command holds the FIFO held open (fd 7).
	script := `exec 7<>"$1"; sh -c 'echo "$PPID $$ $DSSLOCK_TOKEN" > "$0"; while :; do sleep 0.01; done' "$0" & wait`
	cmd := exec.Command(self, "-addr", srv.Addr(), "lock", "-ttl", "1s", "l", "--", "sh", "-c", script, cue, held)
	cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	stderr := newSyncBuffer()
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as a shell makes it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	ps, tok := readPIDs(t, readFIFO(t, cue))
	killAtEnd(t, ps, tok)
	sup := supervisorOf(t, cmd.Process.Pid)
	for _, pid := range ps {
		if g := pgrpOf(t, pid); g != cmd.Process.Pid {
			t.Errorf("process %d of the command is in process group %d; want sskv's, %d", pid, g, cmd.Process.Pid)
		}
	}
	if g := pgrpOf(t, sup); g != sup {
		t.Errorf("the supervisor is in process group %d; want its own, %d", g, sup)
	}
	f, err := os.OpenFile(held, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	treeGone := make(chan struct{})
	go func() {
		defer close(treeGone)
		_, _ = io.Copy(io.Discard, f) // until no process of the command holds it
	}()

	stoppedAt := time.Now()
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGTSTP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-treeGone:
		t.Logf("command's tree gone %v after Ctrl-Z", time.Since(stoppedAt).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatalf("the command's processes still run 10 s after Ctrl-Z; stderr %q", stderr)
	}
	select {
	case <-exited:
		t.Fatalf("sskv exited while stopped: %v", cmd.ProcessState)
	default:
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("sskv has not exited 10 s after SIGCONT; stderr %q", stderr)
	}
	if code := cmd.ProcessState.ExitCode(); code != exitLost || !watchdogSaid.MatchString(stderr.String()) {
		t.Errorf("sskv exited %d, stderr %q; want %d and stderr matching %q", code, stderr, exitLost, watchdogSaid)
	}
	for _, pid := range ps {
		if running(pid, tok) {
			t.Errorf("process %d of the command still runs", pid)
		}
	}
}

// pgrpOf returns the process group of the process pid.
func pgrpOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])) // STATE PPID PGRP ...
	g, err := strconv.Atoi(f[2])
	if err != nil {
		t.Fatalf("stat %q: %v", b, err)
	}
	return g
}
