package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// On Linux, "sskv lock" runs COMMAND under a supervisor: a second process
// of this same binary (see supervise), started with a pipe whose write end
// only this process holds. The supervisor runs COMMAND, obeys the orders
// written on the pipe, and when the pipe reaches its end (this process
// exited, however: kill -9 too) kills every process COMMAND started, and
// exits once they are all gone. This process releases the lock only after
// the supervisor has exited, so after the whole tree is gone.
//
// The supervisor runs in a process group of its own, and puts COMMAND into
// this process's group: a kill of this whole group (kill -9 %1 in a shell,
// timeout -s KILL) ends this process and COMMAND, and the supervisor, which
// lives on, kills the rest. And this process is a child subreaper too: if
// the supervisor alone is killed (the OOM killer, a kill of its PID),
// COMMAND gets SIGKILL (its parent-death signal), the processes it started
// become this process's children, and this process kills them and waits
// until none is left before it releases the lock (see wait).
//
// A paused sskv (SIGSTOP of sskv alone, a debugger, a frozen process) does
// not end, and cannot renew the lock nor decide it lost either: the key
// expires while COMMAND runs on. So this process also sends a heartbeat on
// the pipe, and the supervisor kills the whole tree when none came within
// the watchdog timeout (see watchdogTimeout).

// Orders to the supervisor, one byte each on its control pipe.
const (
	orderInterrupt = 'i' // SIGINT to COMMAND
	orderTerminate = 't' // SIGTERM to COMMAND
	orderStop      = 'T' // SIGTERM to every process of the tree; SIGKILL after the grace
	orderKill      = 'K' // SIGKILL to every process of the tree, now
	orderBeat      = 'b' // a heartbeat: sskv still runs (any order counts as one)
)

// watchdogTimeout is how long the supervisor waits for a heartbeat before
// it kills COMMAND's tree, for a lock whose TTL - RenewDeadline is grace.
//
// Why the tree is dead before the key can expire. Let r be when the holder
// sent the last renewal it saw succeed: the store keeps the key until at
// least r + TTL (it starts the TTL when the renewal arrives; a later
// renewal that succeeded unseen only moves that on), and the holder decides
// "lost" at r + RenewDeadline (lock/internal/lease/holding.go). If sskv pauses at
// p, its last heartbeat reached the supervisor no later than p, so the
// supervisor kills the tree by p + timeout. Either
//   - p < r + RenewDeadline (sskv paused while it still held the lock):
//     the kill comes before r + RenewDeadline + timeout = r + TTL - grace/4,
//     with timeout = 3/4 grace; the last quarter of grace (TTL/12 with the
//     defaults: RenewDeadline 2/3 TTL, grace TTL/3, timeout TTL/4) is the
//     margin for the supervisor's own timer and the SIGKILL to land; or
//   - sskv had decided "lost" before it paused: then it had ordered
//     orderStop, and the supervisor kills the tree itself at the end of the
//     grace, r + TTL, as when sskv does not pause (a pause only brings that
//     kill forward).
//
// A heartbeat goes every timeout/3 (TTL/12 with the defaults), so a healthy
// COMMAND is killed only if sskv misses three in a row: a stall that long
// (TTL/4) would have brought the lock close to its renew deadline anyway.
func watchdogTimeout(grace time.Duration) time.Duration {
	return (grace / 4 * 3).Truncate(time.Millisecond) // shorter, so no later
}

// job is COMMAND, run for "sskv lock".
type job struct {
	name   string        // COMMAND's name, for messages
	sup    *exec.Cmd     // the supervisor
	ctl    *os.File      // the write end of the supervisor's control pipe
	stop   chan struct{} // closed to stop the heartbeats
	beat   chan struct{} // closed once the heartbeats have stopped
	stderr io.Writer
}

// startJob starts argv with the environment env and stdin, stdout and
// stderr under a supervisor. grace is how long processes that COMMAND left
// running when it exited have between SIGTERM and SIGKILL, and TTL -
// RenewDeadline of the lock: it sets the watchdog's timeout.
func startJob(argv, env []string, grace time.Duration, stdin io.Reader, stdout, stderr io.Writer) (*job, error) {
	// Look COMMAND up here, so that a missing or not executable one is
	// reported as any other error of sskv.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	// Refuse to run COMMAND unless its tree can be ended should the
	// supervisor be killed. It lasts as long as this process, which waits
	// for no other child.
	if err := setChildSubreaper(); err != nil {
		return nil, fmt.Errorf("cannot supervise %s: prctl(PR_SET_CHILD_SUBREAPER): %w", argv[0], err)
	}
	r, w, err := os.Pipe() // close-on-exec: no one else gets w
	if err != nil {
		return nil, err
	}
	// /proc/self/exe, not os.Executable: it is this program even if its
	// file was replaced or removed since it started.
	sup := exec.Command("/proc/self/exe")
	timeout := watchdogTimeout(grace)
	sup.Args = append([]string{supervisorArg0, grace.String(), timeout.String(), strconv.Itoa(syscall.Getpgrp()), path}, argv...)
	sup.Env = env
	sup.Stdin, sup.Stdout, sup.Stderr = stdin, stdout, stderr
	sup.ExtraFiles = []*os.File{r}                        // its fd 3
	sup.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a group of its own
	err = sup.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the supervisor of %s: %w", argv[0], err)
	}
	j := &job{name: argv[0], sup: sup, ctl: w, stop: make(chan struct{}), beat: make(chan struct{}), stderr: stderr}
	go j.heartbeat(timeout / 3)
	return j, nil
}

// heartbeat sends orderBeat every interval until j.stop is closed. A
// goroutine of its own: the heartbeats stop only when the whole process
// does (paused or ended), which is what the supervisor watches for.
func (j *job) heartbeat(interval time.Duration) {
	defer close(j.beat)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			j.order(orderBeat)
		case <-j.stop:
			return
		}
	}
}

// signal passes sig, which sskv got, on to COMMAND.
func (j *job) signal(sig os.Signal) {
	switch sig {
	case os.Interrupt:
		j.order(orderInterrupt)
	case syscall.SIGTERM:
		j.order(orderTerminate)
	}
}

// terminate sends SIGTERM to COMMAND and every process it started.
func (j *job) terminate() { j.order(orderStop) }

// kill kills COMMAND and every process it started.
func (j *job) kill() { j.order(orderKill) }

func (j *job) order(o byte) {
	_, _ = j.ctl.Write([]byte{o}) // fails only once the supervisor has exited
}

// wait waits until COMMAND and every process it started are gone, and
// returns COMMAND's exit status as sskv exits with it: 128+N if signal N
// ended it; or an error if the supervisor was killed, once this process has
// killed what it left.
func (j *job) wait() (int, error) {
	err := j.sup.Wait()
	close(j.stop)
	<-j.beat
	j.ctl.Close()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return exitOK, nil
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode(), nil // COMMAND's, as the supervisor exits with it
	}
	// The supervisor was killed (the OOM killer, a kill of its PID, or of
	// its process group). COMMAND had SIGKILL too (its parent-death
	// signal), but not the processes it started: they are this process's
	// children now (a child subreaper), or their descendants. Kill them all,
	// and return only once none is left: then the lock may be released.
	// Only now that the supervisor was waited for: killTree reaps any child.
	if n := killTree(j.name, j.stderr); n > 0 {
		return 0, fmt.Errorf("the supervisor of %s ended (%w): sent SIGKILL to %s of %s's tree, now all gone", j.name, err, processes(n), j.name)
	}
	return 0, fmt.Errorf("the supervisor of %s ended (%w); no process of %s's tree was left", j.name, err, j.name)
}
