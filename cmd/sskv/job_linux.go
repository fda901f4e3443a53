package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
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

// Orders to the supervisor, one byte each on its control pipe.
const (
	orderInterrupt = 'i' // SIGINT to COMMAND
	orderTerminate = 't' // SIGTERM to COMMAND
	orderStop      = 'T' // SIGTERM to every process of the tree; SIGKILL after the grace
	orderKill      = 'K' // SIGKILL to every process of the tree, now
)

// job is COMMAND, run for "sskv lock".
type job struct {
	name string    // COMMAND's name, for messages
	sup  *exec.Cmd // the supervisor
	ctl  *os.File  // the write end of the supervisor's control pipe
}

// startJob starts argv with the environment env and stdin, stdout and
// stderr under a supervisor. grace is how long processes that COMMAND left
// running when it exited have between SIGTERM and SIGKILL.
func startJob(argv, env []string, grace time.Duration, stdin io.Reader, stdout, stderr io.Writer) (*job, error) {
	// Look COMMAND up here, so that a missing or not executable one is
	// reported as any other error of sskv.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe() // close-on-exec: no one else gets w
	if err != nil {
		return nil, err
	}
	// /proc/self/exe, not os.Executable: it is this program even if its
	// file was replaced or removed since it started.
	sup := exec.Command("/proc/self/exe")
	sup.Args = append([]string{supervisorArg0, grace.String(), path}, argv...)
	sup.Env = env
	sup.Stdin, sup.Stdout, sup.Stderr = stdin, stdout, stderr
	sup.ExtraFiles = []*os.File{r} // its fd 3
	err = sup.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the supervisor of %s: %w", argv[0], err)
	}
	return &job{name: argv[0], sup: sup, ctl: w}, nil
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
// ended it.
func (j *job) wait() (int, error) {
	err := j.sup.Wait()
	j.ctl.Close()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return exitOK, nil
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode(), nil // COMMAND's, as the supervisor exits with it
	}
	// Killed itself (the OOM killer, a kill -9 of sskv's process group):
	// COMMAND had SIGKILL too (its parent-death signal), but not the
	// processes it started.
	return 0, fmt.Errorf("the supervisor of %s ended: %w; processes %s started may still run", j.name, err, j.name)
}
