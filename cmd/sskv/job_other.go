//go:build !linux

package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Elsewhere than on Linux, "sskv lock" runs COMMAND as its own child, with
// no supervisor: signals reach COMMAND alone, and processes COMMAND starts,
// or COMMAND itself if sskv is killed, may outlive sskv (see "help lock").

// job is COMMAND, run for "sskv lock".
type job struct {
	cmd *exec.Cmd
}

// startJob starts argv with the environment env and stdin, stdout and
// stderr. grace is for the supervisor of Linux.
func startJob(argv, env []string, _ time.Duration, stdin io.Reader, stdout, stderr io.Writer) (*job, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &job{cmd: cmd}, nil
}

// signal passes sig, which sskv got, on to COMMAND.
func (j *job) signal(sig os.Signal) { _ = j.cmd.Process.Signal(sig) }

// terminate sends SIGTERM to COMMAND.
func (j *job) terminate() { _ = j.cmd.Process.Signal(syscall.SIGTERM) }

// kill kills COMMAND.
func (j *job) kill() { _ = j.cmd.Process.Kill() }

// wait waits for COMMAND to exit and returns its exit status as sskv exits
// with it: 128+N if signal N ended it.
func (j *job) wait() (int, error) {
	err := j.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return exitOK, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return 0, err
}
