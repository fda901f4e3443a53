package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// "sskv lock NAME" on a semaphore's name (whose record never expires)
// fails at once, saying what the key holds, rather than wait forever; so
// does "sskv elect NAME". The command never runs.
func TestLockOnSemaphoreNameFails(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := []string{"-addr", srv.Addr()}
	sskvRun(t, append(a, "lock", "-n", "2", "jobs", "--", "true")...).want(t, exitOK, "", "")
	ran := filepath.Join(t.TempDir(), "ran")
	for _, args := range [][]string{
		{"lock", "jobs", "--", "touch", ran},
		{"lock", "-ttl", "1m", "jobs", "--", "touch", ran},
		{"elect", "jobs", "me"},
	} {
		start := time.Now()
		o := sskvRun(t, append(a, args...)...) // its context lasts 30 s
		took := time.Since(start)
		o.want(t, exitError, "", `not a lock: the key holds "dsslock-semaphore limit=2", a semaphore's record, which never expires`)
		if took > 2*time.Second {
			t.Errorf("%q took %v to fail; want within 2 s", args, took)
		}
		t.Logf("%q: exit %d after %v:\n%s", args, o.code, took, o.stderr)
	}
	if _, err := os.Stat(ran); !os.IsNotExist(err) {
		t.Errorf("the command ran (%v)", err)
	}
}
