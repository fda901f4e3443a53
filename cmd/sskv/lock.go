package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Environment of the command run by "sskv lock".
const (
	envToken = "DSSLOCK_TOKEN"
	envLock  = "DSSLOCK_LOCK"
)

// releaseTimeout bounds the release of the lock after the command exits.
const releaseTimeout = 10 * time.Second

// runLocked waits for the lock name, runs argv while holding it and returns
// the exit status: argv's, or exitLost if the lock was lost meanwhile.
func runLocked(ctx context.Context, c *sskv.Client, name string, argv []string, ttl time.Duration, log *slog.Logger, stdin io.Reader, stdout, stderr io.Writer) int {
	l, err := lock.New(c, lock.Config{Name: name, TTL: ttl, Logger: log})
	if err != nil {
		return fail(stderr, usagef("%v", err)) // err says "lock: ..." itself
	}
	// Signals are passed on to the command once it runs; until then they
	// end the wait (ctx).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	if err := l.Lock(ctx); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "sskv: lock %q: interrupted while waiting\n", name)
			return exitError
		}
		return fail(stderr, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := l.Unlock(rctx); err != nil {
			fmt.Fprintf(stderr, "sskv: %v (it expires after %v)\n", err, ttl)
		}
	}()

	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.Env = append(os.Environ(), envToken+"="+l.Token().String(), envLock+"="+name)
	if err := cmd.Start(); err != nil {
		return fail(stderr, fmt.Errorf("lock %q: %w", name, err))
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// The store can expire the key TTL - RenewDeadline after the holder
	// noticed the loss: the command must be gone by then.
	grace := l.Config().TTL - l.Config().RenewDeadline
	var (
		lost <-chan struct{} = l.Done()
		kill <-chan time.Time
		err2 error
	)
	for done := false; !done; {
		select {
		case err2 = <-exited:
			done = true
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case <-lost:
			lost = nil
			fmt.Fprintf(stderr, "sskv: lock %q %s; sending SIGTERM to %s\n", name, strings.TrimPrefix(l.Err().Error(), "lock: "), argv[0])
			_ = cmd.Process.Signal(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			fmt.Fprintf(stderr, "sskv: %s still running %v after SIGTERM; killing it\n", argv[0], grace)
			_ = cmd.Process.Kill()
		}
	}
	if lost == nil {
		return exitLost
	}
	var ee *exec.ExitError
	switch {
	case err2 == nil:
		return exitOK
	case errors.As(err2, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return fail(stderr, err2)
}
