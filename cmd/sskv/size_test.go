package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// A value larger than the store takes fails at once with a clear message
// (it used to hang for the whole timeout, then exit 1).
func TestSetTooLarge(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	for _, size := range []int{5 << 20, 20 << 20} {
		f := filepath.Join(t.TempDir(), "big")
		if err := os.WriteFile(f, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		o := sskvRun(t, "-addr", srv.Addr(), "set", "big", "-file", f)
		took := time.Since(start)
		if o.code != exitError || !strings.Contains(o.stderr, "larger than the broker's maximum packet size") {
			t.Errorf("set of %d bytes: exit %d, stderr %q; want exit 1 and the size error", size, o.code, o.stderr)
		}
		if took > 5*time.Second {
			t.Errorf("set of %d bytes took %v", size, took)
		}
		t.Logf("%d bytes: %v: %s", size, took.Round(time.Millisecond), strings.TrimSpace(o.stderr))
	}
	sskvRun(t, "-addr", srv.Addr(), "get", "big").want(t, exitNotMet, "", "NOT FOUND")
}
