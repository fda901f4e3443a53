package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRWConfigDemo runs the demo on an in-process store: readers read together,
// the writer's update lands, and the stale reader's write is rejected.
func TestRWConfigDemo(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, ""); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{"waits behind the writer", "holds the lock alone", "REJECTED", "refuses even to send", `"mode=v2": the stale`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}

// TestRWConfigDemoTwice: a second run against the same store starts
// afresh.
func TestRWConfigDemoTwice(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for i := range 2 {
		var out bytes.Buffer
		if err := run(context.Background(), &out, srv.Addr()); err != nil {
			t.Fatalf("run %d: %v\n%s", i+1, err, out.String())
		}
	}
}
