package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the demo on an in-process store: the frozen holder must give
// up before the takeover, its late write must be rejected and the standby's
// value must stand.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, "", 300*time.Millisecond); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{"its lock gave up", "took the lock once A's lease expired", "write REJECTED", "refuses even to send", `"19.5 (from B)"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoTwiceOnOneStore: a second run against the same store (a user
// running it twice against cmd/statestore) starts afresh.
func TestDemoTwiceOnOneStore(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for i := range 2 {
		var out bytes.Buffer
		if err := run(context.Background(), &out, srv.Addr(), 300*time.Millisecond); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, out.String())
		}
	}
}
