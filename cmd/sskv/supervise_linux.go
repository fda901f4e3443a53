package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The supervisor of a COMMAND of "sskv lock" (see job_linux.go for the side
// of sskv). It is this program, run with supervisorArg0 as its argv[0] and
// the arguments GRACE TIMEOUT PGID PATH ARGV0 ARGS...: it runs COMMAND
// (PATH, with the argument list ARGV0 ARGS...) in the process group PGID,
// sskv's, and exits with its status once COMMAND and every process COMMAND
// started have exited.
//
// Why COMMAND's whole tree cannot outlive sskv:
//   - The supervisor is a child subreaper (PR_SET_CHILD_SUBREAPER): a
//     process of the tree whose parent exits becomes the supervisor's child,
//     not init's, so every process of the tree stays a descendant of the
//     supervisor, wherever it moves (its own process group or session).
//   - It reads orders from sskv on a pipe (fd 3) whose write end only sskv
//     holds, and takes the pipe's end as sskv's death. That needs no
//     parent-death signal (which fires when the thread that forked exits,
//     not the process; golang/go#27505).
//   - To end the tree, it signals every descendant it finds in /proc, by a
//     pidfd (taken before it checks the parent again, so it never signals a
//     process that took the number of one that exited), and after SIGKILL
//     does it again each time children exited, until it has no child left:
//     then no process of the tree is left.
//   - It is a watchdog too: sskv sends a heartbeat on the pipe, and when no
//     order came within TIMEOUT (sskv paused: SIGSTOP, a debugger), it
//     kills the tree at once, before the lock can expire (see
//     watchdogTimeout).
//   - The supervisor runs in a process group of its own, so that a kill of
//     sskv's whole group (kill -9 %1 in a shell, timeout -s KILL) ends sskv
//     and COMMAND but not the supervisor, which then kills the rest.
//   - For the case that the supervisor itself is killed (the OOM killer, a
//     kill of its PID), COMMAND has SIGKILL as its parent-death signal, and
//     sskv is a child subreaper too: it adopts the processes COMMAND
//     started, and kills them before it releases the lock (job.wait).
//
// COMMAND is put back into the process group of sskv (PGID, of the same
// session): it reads the terminal and gets the terminal's Ctrl-C and Ctrl-Z
// as it would without sskv; sskv also passes SIGINT and SIGTERM on to it.
// The supervisor, in a background group of the same terminal, gets none of
// these; it catches SIGINT, SIGTERM, SIGHUP and SIGQUIT anyway (sent to it
// alone, they must not end it before the tree), and ignores SIGTTOU and
// SIGTTIN, so that a message of its own on the terminal never stops it.
// Ctrl-Z stops sskv and COMMAND, not the supervisor: the heartbeats stop,
// and its watchdog kills the tree after TIMEOUT (the lock cannot be renewed
// meanwhile), the safe outcome; after fg, sskv exits with status 4.

// supervisorArg0 is the argv[0] with which sskv runs its supervisor. No
// program is installed under such a name. It does not contain "sskv", so
// that pkill -f sskv, which kills sskv, spares the supervisor, which then
// ends the tree.
const supervisorArg0 = "dsslock-supervisor"

// ctlFD is the supervisor's end of the control pipe.
const ctlFD = 3

func init() {
	// Before main, and before TestMain in the tests: the supervisor is the
	// test binary there.
	if len(os.Args) > 0 && os.Args[0] == supervisorArg0 {
		syscall.CloseOnExec(ctlFD) // not inherited by COMMAND
		os.Exit(supervise(os.Args[1:], os.NewFile(ctlFD, "control"), os.Stderr))
	}
}

// supervise runs the supervisor with args (GRACE TIMEOUT PGID PATH ARGV0
// ARGS...), orders read from ctl, and messages to stderr, and returns its
// exit status.
func supervise(args []string, ctl io.Reader, stderr io.Writer) int {
	if len(args) < 5 {
		fmt.Fprintln(stderr, "sskv: the supervisor is for sskv lock, not to run by hand")
		return exitUsage
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "sskv: supervisor: %v\n", err)
		return exitUsage
	}
	timeout, err := time.ParseDuration(args[1])
	if err != nil || timeout <= 0 {
		fmt.Fprintf(stderr, "sskv: supervisor: heartbeat timeout %q: want a positive duration\n", args[1])
		return exitUsage
	}
	pgid, err := strconv.Atoi(args[2])
	if err != nil || pgid <= 0 {
		fmt.Fprintf(stderr, "sskv: supervisor: process group %q: want a positive number\n", args[2])
		return exitUsage
	}
	args = args[2:] // then args[1] is PATH, and args[2:] ARGV0 ARGS...
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	cmd := &exec.Cmd{
		Path: args[1], Args: args[2:],
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{
			// Sent when the thread that forks exits (golang/go#27505):
			// here the main thread, to which init is locked, and which
			// exits only with the supervisor.
			Pdeathsig: syscall.SIGKILL,
			// sskv's group: the terminal's job control reaches it.
			Setpgid: true, Pgid: pgid,
		},
	}
	// Refuse to run COMMAND unless the tree can be ended.
	err = setChildSubreaper()
	if err != nil {
		err = fmt.Errorf("cannot supervise %s: prctl(PR_SET_CHILD_SUBREAPER): %w", args[2], err)
	} else if err = checkProc(); err != nil {
		err = fmt.Errorf("cannot supervise %s: %w", args[2], err)
	} else {
		err = cmd.Start()
	}
	// Only now, so that COMMAND inherits sskv's dispositions of these, not
	// SIG_IGN (an ignored signal stays ignored across exec). The messages
	// below come after it.
	signal.Ignore(syscall.SIGTTOU, syscall.SIGTTIN)
	if err != nil {
		fmt.Fprintf(stderr, "sskv: %v\n", err)
		return exitError
	}
	s := &supervisor{cmd: cmd, name: args[2], grace: grace, timeout: timeout, stderr: stderr}
	return s.run(ctl)
}

// setChildSubreaper makes this process the reaper of its orphaned
// descendants.
func setChildSubreaper() error {
	const prSetChildSubreaper = 36 // <linux/prctl.h>
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// supervisor is the state of a running supervisor.
type supervisor struct {
	cmd         *exec.Cmd // COMMAND
	name        string    // COMMAND's argv[0], for messages
	grace       time.Duration
	timeout     time.Duration // of the watchdog: see watchdogTimeout
	stderr      io.Writer
	exited      bool // COMMAND has exited (and was reaped)
	status      int  // COMMAND's exit status, once exited
	terminating bool // the tree got SIGTERM
	killing     bool // the tree is being killed
	starved     bool // the watchdog killed the tree
}

// run supervises COMMAND until it and every process it started are gone,
// and returns COMMAND's exit status (128+N if signal N ended it), or
// exitLost if the watchdog killed the tree: then sskv, once it runs again,
// exits with it, as when it found the lock lost.
func (s *supervisor) run(ctl io.Reader) int {
	orders := make(chan byte)
	go readOrders(ctl, orders)
	exits := make(chan []childExit)
	go reap(exits)
	var killAt <-chan time.Time
	// The watchdog: every order from sskv (a heartbeat at least) resets
	// it; the end of the pipe stops it.
	watchdog := time.NewTimer(s.timeout)
	defer watchdog.Stop()
	for {
		select {
		case o := <-orders:
			if o == 0 {
				watchdog.Stop()
			} else {
				watchdog.Reset(s.timeout)
			}
			switch o {
			case orderInterrupt:
				s.signalCommand(syscall.SIGINT)
			case orderTerminate:
				s.signalCommand(syscall.SIGTERM)
			case orderStop:
				killAt = s.terminate(killAt)
			case orderKill:
				s.kill()
			case 0: // the end of the pipe: sskv has exited
				if n := s.kill(); n > 0 {
					fmt.Fprintf(s.stderr, "sskv: sskv exited while %s ran: sent SIGKILL to %s\n", s.name, processes(n))
				}
			}
		case batch, ok := <-exits:
			if !ok {
				if s.starved {
					return exitLost
				}
				return s.status // no child left, so no descendant
			}
			for _, e := range batch {
				if e.pid == s.cmd.Process.Pid {
					s.exited, s.status = true, exitStatus(e.status)
				}
			}
			switch {
			case s.killing:
				// The children of those that exited are now the
				// supervisor's.
				s.kill()
			case s.exited && !s.terminating:
				// COMMAND ended: so does whatever it left running.
				killAt = s.terminate(killAt)
			}
		case <-watchdog.C:
			// No heartbeat: sskv is paused (or stalled as long), and can
			// neither renew the lock nor end COMMAND when it is lost. No
			// time for SIGTERM's grace: the kill must come before the key
			// can expire.
			if s.killing {
				break
			}
			s.starved = true
			n := s.kill()
			fmt.Fprintf(s.stderr, "sskv: sskv lock stopped answering for %v (paused?): killed %s's tree (%s) before its lock can expire\n", s.timeout, s.name, processes(n))
		case <-killAt:
			killAt = nil
			if s.killing {
				break // sskv ordered it first
			}
			if n := s.kill(); n > 0 {
				fmt.Fprintf(s.stderr, "sskv: %s still running %v after SIGTERM: sent SIGKILL\n", processes(n), s.grace)
			}
		}
	}
}

// signalCommand sends sig to COMMAND, unless it has exited.
func (s *supervisor) signalCommand(sig syscall.Signal) {
	if !s.exited {
		_ = s.cmd.Process.Signal(sig)
	}
}

// terminate sends SIGTERM to every process of the tree, once, and returns
// when to kill them. killAt is the time it returned before, if any.
func (s *supervisor) terminate(killAt <-chan time.Time) <-chan time.Time {
	if s.terminating || s.killing {
		return killAt
	}
	s.terminating = true
	n := signalTree(syscall.SIGTERM, s.name, s.stderr)
	if s.exited && n > 0 {
		fmt.Fprintf(s.stderr, "sskv: %s exited, leaving %s running: sent them SIGTERM\n", s.name, processes(n))
	}
	return time.After(s.grace)
}

// kill sends SIGKILL to every process of the tree, and marks the tree as
// being killed: then each exit of a child sends it again. It returns how
// many processes it signalled.
func (s *supervisor) kill() int {
	s.killing = true
	return signalTree(syscall.SIGKILL, s.name, s.stderr)
}

func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return strconv.Itoa(n) + " processes"
}

// readOrders sends each byte read from ctl to orders, then 0 at its end
// (or error).
func readOrders(ctl io.Reader, orders chan<- byte) {
	b := make([]byte, 1)
	for {
		if n, err := ctl.Read(b); n == 1 && b[0] != 0 {
			orders <- b[0]
		} else if err != nil {
			orders <- 0
			return
		}
	}
}

// childExit is a child that exited, and how.
type childExit struct {
	pid    int
	status syscall.WaitStatus
}

// reap reaps the supervisor's children as they exit, and sends each batch
// to exits. It closes exits once the supervisor has no child left.
func reap(exits chan<- []childExit) {
	defer close(exits)
	for {
		var batch []childExit
		opts := 0 // the first wait blocks; then take all that exited too
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, opts, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 { // ECHILD: no child left; 0: none exited
				break
			}
			batch = append(batch, childExit{pid, ws})
			opts = syscall.WNOHANG
		}
		if len(batch) == 0 {
			return
		}
		exits <- batch
	}
}

// exitStatus is the exit status of sskv for a COMMAND that ended with ws.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// signalTree sends sig to every live process that descends from this
// process (the supervisor; or sskv, once its supervisor was killed: see
// job.wait), and returns how many it signalled. name is COMMAND's, for
// messages to stderr.
func signalTree(sig syscall.Signal, name string, stderr io.Writer) int {
	procs, err := readProcs()
	if err != nil {
		fmt.Fprintf(stderr, "sskv: %v\n", err)
		return 0
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	self := os.Getpid()
	tree := map[int]bool{self: true} // processes known to descend from this one
	queue := children[self]
	n := 0
	for len(queue) > 0 {
		pid := queue[0]
		queue = append(queue[1:], children[pid]...)
		if signalDescendant(pid, sig, tree, name, stderr) {
			n++
		}
	}
	return n
}

// killTree kills every process that descends from this process, and reaps
// its children, until it has none left: then no process of the tree runs.
// It returns how many processes it signalled first. Each child that exits
// makes it signal the tree again, for the children of that child, which are
// this process's now (a child subreaper), and for any they forked before
// SIGKILL reached them. It reaps any child: only for a process that waits
// for no child of its own (sskv, once it has waited for its supervisor).
func killTree(name string, stderr io.Writer) int {
	exits := make(chan []childExit)
	go reap(exits)
	n := signalTree(syscall.SIGKILL, name, stderr)
	for range exits {
		signalTree(syscall.SIGKILL, name, stderr)
	}
	return n
}

// signalDescendant sends sig to the process pid if it is a live child of a
// process of tree, adds it to tree if it is a child, and reports whether it
// signalled it.
func signalDescendant(pid int, sig syscall.Signal, tree map[int]bool, name string, stderr io.Writer) bool {
	// A pidfd (since Linux 5.3; before, only the number): p is the process
	// that has the number pid now, even if it exits and another one gets
	// the number. Its parent is read again after: if p still lives then,
	// that is p's.
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	defer p.Release()
	st, err := readStat(pid)
	if err != nil || !tree[st.ppid] {
		return false
	}
	tree[pid] = true
	if st.zombie {
		return false
	}
	if err := p.Signal(sig); err != nil {
		if !errors.Is(err, os.ErrProcessDone) {
			fmt.Fprintf(stderr, "sskv: cannot signal process %d, which %s started: %v\n", pid, name, err)
		}
		return false
	}
	return true
}

// procStat is what the supervisor reads of /proc/PID/stat.
type procStat struct {
	ppid   int
	zombie bool // exited, not yet reaped
}

// checkProc checks that /proc lists the processes of this process's PID
// namespace.
func checkProc() error {
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return fmt.Errorf("listing processes: %w", err)
	}
	if self != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("/proc is not of this PID namespace (/proc/self is %s, this is %d)", self, os.Getpid())
	}
	_, err = readProcs()
	return err
}

// readProcs reads the parent and state of every process.
func readProcs() (map[int]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	procs := make(map[int]procStat, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if st, err := readStat(pid); err == nil { // else it has exited meanwhile
			procs[pid] = st
		}
	}
	return procs, nil
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseStat(b)
}

// parseStat parses the contents of /proc/PID/stat: "PID (COMM) STATE PPID
// ...", where COMM may hold any byte but NUL, spaces and ")" too.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("stat %q: no ')'", b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return procStat{}, fmt.Errorf("stat %q: no parent", b)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("stat %q: parent: %w", b, err)
	}
	return procStat{ppid: ppid, zombie: f[0] == "Z" || f[0] == "X"}, nil
}
