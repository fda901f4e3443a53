package main

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// Siblings of kill -9 of sskv (TestLockKill9EndsCommandTree): other ways a
// user's tools end sskv's processes. In each, the next holder of the lock
// takes it, and no process of the earlier holder's COMMAND may run by then.

// workerScript starts a worker that runs until killed, in a session of its
// own (as a daemon is) when setsid is "setsid", and writes "PID TOKEN" to
// the named pipe $0 once it runs.
func workerScript(setsid string) string {
	return setsid + ` sh -c 'echo "$$ $DSSLOCK_TOKEN" > "$0"; while :; do sleep 0.01; done' "$0" >/dev/null 2>&1 &
wait`
}

// takeNext takes the lock l as the next holder would, once the store lets
// it (the earlier holder's key released or expired).
func takeNext(t *testing.T, addr, name string) {
	t.Helper()
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := lock.Acquire(ctx, c, lock.Config{Name: name, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Unlock(context.Background()) })
}

// kill -9 of sskv's whole process group, as "kill -9 %1" in a shell and
// "timeout -s KILL" do: sskv and COMMAND end at once, and a worker that
// COMMAND started in a session of its own must not outlive the lock.
// ("pkill -9 -f sskv" is another case: it kills each process whose command
// line holds "sskv", the supervisor's too; see "sskv help lock".)
func TestLockKillOfProcessGroupEndsTree(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	cue := fifo(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-addr", srv.Addr(), "lock", "-ttl", "600ms", "l", "--", "sh", "-c", workerScript("setsid"), cue)
	cmd.Env = append(os.Environ(), "SSKV_TEST_MAIN=1", "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a job of its own, as a shell makes it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	ps, tok := readPIDs(t, readFIFO(t, cue))
	killAtEnd(t, ps, tok)

	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	takeNext(t, srv.Addr(), "l")
	for _, pid := range ps {
		if running(pid, tok) {
			t.Errorf("process %d of the earlier holder's command still runs when the next holder has the lock", pid)
		}
	}
}

// kill -9 of the supervisor alone (the OOM killer, a mistaken kill of its
// PID): COMMAND gets its parent-death signal, but the processes it started
// run on. sskv must then not hand the lock on while they may run.
func TestLockSupervisorKilledDoesNotReleaseOverWorkers(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	cue := fifo(t)
	p := startSSKV(t, "-addr", srv.Addr(), "lock", "-ttl", "600ms", "l", "--", "sh", "-c", workerScript(""), cue)
	ps, tok := readPIDs(t, readFIFO(t, cue))
	killAtEnd(t, ps, tok)
	sup := supervisorOf(t, p.cmd.Process.Pid)
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.exitCode(t)
	takeNext(t, srv.Addr(), "l")
	for _, pid := range ps {
		if running(pid, tok) {
			t.Errorf("process %d of the earlier holder's command still runs when the next holder has the lock; sskv's stderr %q", pid, p.stderr)
		}
	}
}

// supervisorOf returns the PID of the supervisor that sskv (PID pid) runs.
func supervisorOf(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(child)
		if err != nil || st.ppid != pid {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.HasPrefix(string(b), supervisorArg0+"\x00") {
			return child
		}
	}
	t.Fatalf("no supervisor among the children of sskv %d", pid)
	return 0
}
