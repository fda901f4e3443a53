package main

import (
	"context"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// Issue 33 item 3: "a key that will never be released is an error, not a
// silent wait", for "any value without expiry that no lock wrote". A user
// who set NAME by hand ("sskv set NAME VALUE", no -px) and then runs
// "sskv lock NAME" must not wait in silence: the store cannot say that the
// key never expires, but sskv can at least say on stderr, within a couple
// of seconds, what holds the key, so that the user can tell a held lock
// from a key that will never be released.
func TestLockOnKeySetByHandIsNotSilent(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c, err := sskv.Dial(context.Background(), sskv.Config{Addr: srv.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(context.Background(), "jobs/nightly", []byte("hello"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startSSKV(t, "-addr", srv.Addr(), "lock", "jobs/nightly", "--", "true")
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(p.stderr.String(), "hello") {
		select {
		case <-p.exited:
			t.Logf("sskv exited %d: stderr %q", p.cmd.ProcessState.ExitCode(), p.stderr)
			if !strings.Contains(p.stderr.String(), "hello") {
				t.Fatalf("sskv exited without naming what holds the key: stderr %q", p.stderr)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.signal(t, syscall.SIGINT)
			t.Fatalf("3 s on, sskv lock waits for a key set by hand without expiry and has said nothing of it: stderr %q", p.stderr)
		}
	}
}

// The line comes at once, naming what holds the key, and the lock's own
// warning reaches the user too, without -v: at TTL 100ms, a safeguard
// recheck 10 TTLs on finds the key unchanged.
func TestLockOnKeySetByHandWarns(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	setOK(t, "-addr", srv.Addr(), "set", "k", "hello")
	p := startSSKV(t, "-addr", srv.Addr(), "lock", "-ttl", "100ms", "k", "--", "true")
	p.stderr.WaitFor(t, regexp.MustCompile(`^sskv: lock "k" is held by "hello"; waiting for its release or expiry \(a value set by hand without expiry is never released: 'sskv del k'\)\n`))
	p.stderr.WaitFor(t, regexp.MustCompile(`(?m)^time=\S+ level=WARN msg="lock: the key has not changed since the last safeguard check`))
	p.signal(t, syscall.SIGINT)
	p.wantExit(t, exitError, `sskv: lock "k": interrupted while waiting`)
}
