package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// Several "sskv lock" runs of one lock, at once: their commands never
// overlap, each gets the token and the lock's name, and the lock is free
// when they are done.
func TestLockMutualExclusion(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	journal := filepath.Join(t.TempDir(), "journal")
	script := `echo "in $DSSLOCK_TOKEN $DSSLOCK_LOCK" >> "$0"; sleep 0.05; echo out >> "$0"`
	var wg sync.WaitGroup
	outs := make([]outcome, 4)
	for i := range outs {
		wg.Go(func() {
			outs[i] = sskvRun(t, "-addr", srv.Addr(), "lock", "-ttl", "2s", "jobs/x", "--", "sh", "-c", script, journal)
		})
	}
	wg.Wait()
	for _, o := range outs {
		o.want(t, exitOK, "", "")
	}
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	in := regexp.MustCompile(`^in (\d{15}:\d{5}:statestore) jobs/x$`)
	var last hlc.Timestamp
	for i := 0; i < len(lines); i += 2 {
		m := in.FindStringSubmatch(lines[i])
		if m == nil || i+1 >= len(lines) || lines[i+1] != "out" {
			t.Fatalf("commands overlapped or lacked the environment:\n%s", data)
		}
		tok, err := hlc.Parse(m[1])
		if err != nil || !tok.After(last) {
			t.Fatalf("token %q not after %v: %v", m[1], last, err)
		}
		last = tok
	}
	if len(lines) != 2*len(outs) {
		t.Fatalf("journal has %d lines; want %d:\n%s", len(lines), 2*len(outs), data)
	}
	sskvRun(t, "-addr", srv.Addr(), "get", "jobs/x").want(t, exitNotMet, "", "NOT FOUND")
}

// The command's exit status is sskv's; the token works for fenced writes
// from the command, and is refused once a newer holder wrote.
func TestLockStatusAndFencedWrite(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := []string{"-addr", srv.Addr(), "lock", "l", "--"}
	sskvRun(t, append(a, "sh", "-c", "exit 7")...).want(t, 7, "", "")
	sskvRun(t, append(a, "sh", "-c", "kill -TERM $$")...).want(t, 128+int(syscall.SIGTERM), "", "")
	sskvRun(t, append(a, "/nonexistent/command")...).want(t, exitError, "", "no such file")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSKV_TEST_MAIN", "1")
	// The command writes with its token, and prints the token.
	write := `"$0" -addr "$1" set -ft "$DSSLOCK_TOKEN" data "$2" >/dev/null && echo "$DSSLOCK_TOKEN"`
	first := sskvRun(t, append(a, "sh", "-c", write, self, srv.Addr(), "first")...)
	second := sskvRun(t, append(a, "sh", "-c", write, self, srv.Addr(), "second")...)
	first.want(t, exitOK, first.stdout, "")
	second.want(t, exitOK, second.stdout, "")
	t1, err1 := hlc.Parse(strings.TrimSpace(first.stdout))
	t2, err2 := hlc.Parse(strings.TrimSpace(second.stdout))
	if err1 != nil || err2 != nil || !t2.After(t1) {
		t.Fatalf("tokens %q then %q: want increasing HLC versions", first.stdout, second.stdout)
	}
	// The first holder's token no longer writes the key: the second's
	// fenced it.
	sskvRun(t, "-addr", srv.Addr(), "set", "-ft", t1.String(), "data", "late").
		want(t, exitError, "", "lower version than the fencing token")
	if o := sskvRun(t, "-addr", srv.Addr(), "get", "data"); !strings.HasPrefix(o.stdout, "second\n") {
		t.Fatalf("data = %q; want the second holder's write", o.stdout)
	}
}

// A lock lost while the command runs: the command gets SIGTERM, sskv exits
// 4 with the reason.
func TestLockLostTerminatesCommand(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	dir := t.TempDir()
	started, trapped := filepath.Join(dir, "started"), filepath.Join(dir, "trapped")
	script := `trap 'echo TERM > "$1"; exit 0' TERM; : > "$0"; while :; do sleep 0.01; done`
	done := make(chan outcome, 1)
	// TTL 1s: the watchdog's timeout on Linux (TTL/4) is then longer than
	// the stalls of this test process, which is sskv here, under -race.
	go func() {
		done <- sskvRun(t, "-addr", srv.Addr(), "lock", "-ttl", "1s", "l", "--", "sh", "-c", script, started, trapped)
	}()
	waitFile(t, started)
	// Someone takes the key: the holder's next renewal finds it held by
	// another.
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(context.Background(), "l", []byte("intruder"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	o := <-done
	o.want(t, exitLost, "", `sskv: lock "l" lost: held by another holder`)
	if b, err := os.ReadFile(trapped); err != nil || string(b) != "TERM\n" {
		t.Fatalf("the command did not get SIGTERM: %q, %v", b, err)
	}
	// The intruder's key stays: sskv deletes only its own.
	if res, err := c.Get(context.Background(), "l"); err != nil || string(res.Value) != "intruder" {
		t.Fatalf("after the loss, l = %+v, %v; want the intruder's", res, err)
	}
}

// With -max-hold, the lock is given up at its cap although it renews: the
// command gets SIGTERM, sskv exits with status 4, and the key, still the
// holder's, is released once the command has exited. So for a lock, and
// for a read-write lock's read (-r) and write (-w) holdings.
func TestLockMaxHoldTerminatesCommand(t *testing.T) {
	for _, tc := range []struct {
		kind string
		keys []string // the keys the holding may have held
	}{
		{"", []string{"l"}},
		{"-r", append(rwSlots("l"), lock.RWMutexGate("l"))},
		{"-w", []string{lock.RWMutexGate("l")}},
	} {
		t.Run("lock"+tc.kind, func(t *testing.T) {
			srv := startStore(t, localstore.Config{})
			dir := t.TempDir()
			started, trapped := filepath.Join(dir, "started"), filepath.Join(dir, "trapped")
			script := `trap 'echo TERM > "$1"; exit 0' TERM; : > "$0"; while :; do sleep 0.01; done`
			args := []string{"-addr", srv.Addr(), "lock", "-ttl", "1s", "-max-hold", "1500ms"}
			if tc.kind != "" {
				args = append(args, tc.kind)
			}
			o := sskvRun(t, append(args, "l", "--", "sh", "-c", script, started, trapped)...)
			o.want(t, exitLost, "", `sskv: lock "l" lost: held for MaxHold (1.5s)`)
			if b, err := os.ReadFile(trapped); err != nil || string(b) != "TERM\n" {
				t.Fatalf("the command did not get SIGTERM: %q, %v", b, err)
			}
			c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, k := range tc.keys {
				if res, err := c.Get(context.Background(), k); err != nil || res.Found {
					t.Fatalf("after sskv exited, %q = %+v, %v; want it released", k, res, err)
				}
			}
		})
	}
}

// rwSlots returns the reader slot keys of sskv lock -r NAME (16 readers).
func rwSlots(name string) []string {
	var ks []string
	for i := range lock.DefaultMaxReaders {
		ks = append(ks, lock.RWMutexReader(name, i))
	}
	return ks
}

func TestLockMaxHoldUsage(t *testing.T) {
	for _, args := range [][]string{
		{"lock", "-max-hold", "-1s", "l", "--", "true"},
		{"lock", "-max-hold", "-1s", "-r", "l", "--", "true"},
		{"lock", "-max-hold", "1500us", "-w", "l", "--", "true"},
	} {
		o := sskvRun(t, args...)
		if o.code != exitUsage {
			t.Errorf("sskv %v: status %d, stderr %q; want a usage error", args, o.code, o.stderr)
		}
	}
}

// SIGTERM to sskv reaches the command; the lock is released after the
// command exits, and sskv exits with the command's status.
func TestLockPassesSignalsOn(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	dir := t.TempDir()
	started, trapped := filepath.Join(dir, "started"), filepath.Join(dir, "trapped")
	script := `trap 'echo TERM > "$1"; exit 3' TERM; : > "$0"; while :; do sleep 0.01; done`
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-addr", srv.Addr(), "lock", "l", "--", "sh", "-c", script, started, trapped)
	cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, started)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("sskv exited %v (stderr %q); want the command's status 3", err, stderr.String())
	}
	if b, err := os.ReadFile(trapped); err != nil || string(b) != "TERM\n" {
		t.Fatalf("the command did not get SIGTERM: %q, %v", b, err)
	}
	sskvRun(t, "-addr", srv.Addr(), "get", "l").want(t, exitNotMet, "", "NOT FOUND")
}

// waitFile waits for a file that a command creates when it has started.
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not created", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// "sskv lock -n 2", several processes at once: at most two commands run at
// once, each in a slot of its own with that slot's token, all of them run
// and finish, and every slot is free afterwards. A run that asks another
// limit fails rather than exceed it.
func TestLockSemaphoreProcesses(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	journal := filepath.Join(t.TempDir(), "journal")
	// One append per line: each is one write(2) to a file opened with
	// O_APPEND, so lines of concurrent commands do not mix.
	script := `echo "in $DSSLOCK_SLOT $DSSLOCK_TOKEN $DSSLOCK_LOCK" >> "$0"; sleep 0.2; echo "out $DSSLOCK_SLOT" >> "$0"`
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const runs = 5
	var wg sync.WaitGroup
	errs := make([]error, runs)
	stderrs := make([]bytes.Buffer, runs)
	for i := range runs {
		cmd := exec.Command(self, "-addr", srv.Addr(), "lock", "-n", "2", "-ttl", "2s", "fleet/fw", "--", "sh", "-c", script, journal)
		cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1")
		cmd.Stderr = &stderrs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs[i] = cmd.Wait() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("run %d: %v, stderr %q", i, err, stderrs[i].String())
		}
	}
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	in := regexp.MustCompile(`^in ([01]) (\d{15}:\d{5}:statestore) fleet/fw$`)
	running := map[string]bool{} // slots in use
	most, ins := 0, 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if m := in.FindStringSubmatch(line); m != nil {
			if running[m[1]] {
				t.Fatalf("two commands in slot %s at once:\n%s", m[1], data)
			}
			if _, err := hlc.Parse(m[2]); err != nil {
				t.Fatalf("token %q: %v", m[2], err)
			}
			running[m[1]] = true
			ins++
			most = max(most, len(running))
			continue
		}
		slot, ok := strings.CutPrefix(line, "out ")
		if !ok || !running[slot] {
			t.Fatalf("unexpected line %q:\n%s", line, data)
		}
		delete(running, slot)
	}
	if ins != runs || len(running) != 0 {
		t.Fatalf("%d commands ran, %d still in; want %d, all out:\n%s", ins, len(running), runs, data)
	}
	if most != 2 {
		t.Errorf("at most %d commands at once; want 2 (the limit, with 5 runs of 0.2 s started together)", most)
	}
	for _, slot := range []string{"0", "1"} {
		sskvRun(t, "-addr", srv.Addr(), "get", "fleet/fw\x00slot\x00"+slot).want(t, exitNotMet, "", "NOT FOUND")
	}
	sskvRun(t, "-addr", srv.Addr(), "lock", "-n", "3", "fleet/fw", "--", "true").want(t, exitError, "", "limit mismatch")
	sskvRun(t, "-addr", srv.Addr(), "lock", "-n", "0", "fleet/fw", "--", "true").want(t, exitUsage, "", "-n 0")
}

// "sskv lock -r" runs read together; "sskv lock -w" waits for them, then
// runs alone, with a token newer than theirs.
func TestLockRW(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	dir := t.TempDir()
	journal, gate := filepath.Join(dir, "journal"), filepath.Join(dir, "go")
	// A reader says it is in, waits for the other reader to be in too (so
	// both read at once), then for the test's go.
	reader := `echo "r $DSSLOCK_TOKEN" >> "$0"; : > "$1"; until [ -e "$2" ] && [ -e "$3" ]; do sleep 0.01; done; ` +
		`until [ -e "$4" ]; do sleep 0.01; done; echo "r-out" >> "$0"`
	writer := `echo "w $DSSLOCK_TOKEN" >> "$0"`
	in0, in1 := filepath.Join(dir, "in0"), filepath.Join(dir, "in1")
	outs := make(chan outcome, 3)
	for _, in := range []string{in0, in1} {
		go func() {
			outs <- sskvRun(t, "-addr", srv.Addr(), "lock", "-r", "-ttl", "2s", "cfg", "--", "sh", "-c", reader, journal, in, in0, in1, gate)
		}()
	}
	waitFile(t, in0)
	waitFile(t, in1)
	go func() {
		outs <- sskvRun(t, "-addr", srv.Addr(), "lock", "-w", "-ttl", "2s", "cfg", "--", "sh", "-c", writer, journal)
	}()
	// The writer holds the gate, waiting for the readers.
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := c.Watch(ctx, "cfg\x00gate")
	if err != nil {
		t.Fatal(err)
	}
	for ev := range w.Events() {
		if ev.Op == sskv.OpSet {
			break
		}
	}
	w.Stop()
	if ctx.Err() != nil {
		t.Fatal("the writer did not take the gate")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		(<-outs).want(t, exitOK, "", "")
	}
	data, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	line := regexp.MustCompile(`^([rw]) (\d{15}:\d{5}:statestore)$`)
	if len(lines) != 5 || lines[2] != "r-out" || lines[3] != "r-out" {
		t.Fatalf("want 2 readers in, both out, then the writer:\n%s", data)
	}
	var toks []hlc.Timestamp
	for _, i := range []int{0, 1, 4} {
		m := line.FindStringSubmatch(lines[i])
		if m == nil {
			t.Fatalf("line %q:\n%s", lines[i], data)
		}
		tok, err := hlc.Parse(m[2])
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	if !strings.HasPrefix(lines[4], "w ") || !toks[2].After(toks[0]) || !toks[2].After(toks[1]) {
		t.Fatalf("the writer's token is not after the readers':\n%s", data)
	}
	sskvRun(t, "-addr", srv.Addr(), "lock", "-r", "-n", "2", "cfg", "--", "true").want(t, exitUsage, "", "exclude each other")
	sskvRun(t, "-addr", srv.Addr(), "lock", "cfg", "--", "true").want(t, exitError, "", "read-write lock's record")
}
