package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestJSONAndSVG runs the demo on its own in-process store with -json and
// -svg: one JSON object with exactly the documented fields and every check
// passed, and a picture that is well-formed XML with a lane per candidate.
func TestJSONAndSVG(t *testing.T) {
	t.Parallel()
	svg := filepath.Join(t.TempDir(), "run.svg")
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-json", "-ttl", "500ms", "-svg", svg}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit status %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
	}

	// Exactly one JSON object, and nothing else, on stdout.
	dec := json.NewDecoder(bytes.NewReader(stdout.Bytes()))
	var fields map[string]json.RawMessage
	if err := dec.Decode(&fields); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, &stdout)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Errorf("more than one JSON value on stdout:\n%s", &stdout)
	}
	want := []string{"accepted", "counter", "handover_ms", "ok", "rejected_stale", "takeover_ms", "ttl_ms"}
	if got := slices.Sorted(maps.Keys(fields)); !slices.Equal(got, want) {
		t.Errorf("JSON fields %v, want %v", got, want)
	}
	if string(fields["ok"]) != "true" {
		t.Errorf("ok = %s, want true; stderr:\n%s", fields["ok"], &stderr)
	}
	var res result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("JSON fields of the wrong types: %v\n%s", err, &stdout)
	}
	t.Logf("%+v", res)
	switch {
	case res.Counter != int64(res.Accepted):
		t.Errorf("counter %d, but %d writes accepted", res.Counter, res.Accepted)
	case res.Accepted < 4:
		t.Errorf("only %d writes accepted; every leader should write", res.Accepted)
	}
	if res.RejectedStale < 1 {
		t.Errorf("rejected_stale = %d, want at least 1", res.RejectedStale)
	}
	if res.TTLMS != 500 {
		t.Errorf("ttl_ms = %d, want 500", res.TTLMS)
	}
	// A resignation hands over without waiting for the TTL; a crashed
	// leader's key expires a TTL after its last renewal was sent, not
	// earlier.
	if res.HandoverMS < 0 || res.HandoverMS >= float64(res.TTLMS)/2 {
		t.Errorf("handover_ms = %v, want well under the TTL", res.HandoverMS)
	}
	if res.TakeoverMS < 0 || res.TakeoverMS < float64(res.TTLMS)-5 {
		t.Errorf("takeover_ms = %v, want at least the TTL (%d ms)", res.TakeoverMS, res.TTLMS)
	}
	if stderr.Len() > 0 {
		t.Errorf("stderr:\n%s", &stderr)
	}

	data, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	classes := svgClasses(t, data)
	if classes["lane"] != 3 || classes["term"] < 4 || classes["write accepted"] != res.Accepted || classes["write rejected"] != res.RejectedStale {
		t.Errorf("the picture has %v; want 3 lanes, 4 terms, %d accepted and %d rejected writes", classes, res.Accepted, res.RejectedStale)
	}
}

// svgClasses checks that data is an SVG document and counts its elements
// by class.
func svgClasses(t *testing.T, data []byte) map[string]int {
	t.Helper()
	classes := map[string]int{}
	dec := xml.NewDecoder(bytes.NewReader(data))
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the picture is not well-formed XML: %v", err)
		}
		if el, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = el.Name.Space + " " + el.Name.Local
			}
			for _, a := range el.Attr {
				if a.Name.Local == "class" {
					classes[a.Value]++
				}
			}
		}
	}
	if root != "http://www.w3.org/2000/svg svg" {
		t.Fatalf("the picture's root element is %q", root)
	}
	return classes
}

// TestTimelineTwiceOnOneStore runs the demo twice against one store, as a
// user would against cmd/statestore: the first time with -addr, the
// second with the AIO_* environment. Each run starts afresh and tells the
// whole story.
func TestTimelineTwiceOnOneStore(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	host, port, _ := net.SplitHostPort(srv.Addr())
	t.Setenv(sskv.EnvBrokerHostname, host)
	t.Setenv(sskv.EnvBrokerPort, port)
	t.Setenv(sskv.EnvUseTLS, "false")
	t.Setenv(sskv.EnvClientID, "failover-env")

	for _, args := range [][]string{{"-addr", srv.Addr()}, {"-env"}} {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), append(args, "-ttl", "400ms"), &stdout, &stderr)
		if code != exitOK {
			t.Fatalf("%v: exit status %d\nstdout:\n%s\nstderr:\n%s", args, code, &stdout, &stderr)
		}
		out := stdout.String()
		for _, want := range []string{
			"a handover, no waiting for the TTL",
			"a takeover once the key expired",
			"its term ends on its own clock",
			"its fenced writer refuses to send",
			"is REJECTED by the state store",
			"all checks passed",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: the timeline lacks %q:\n%s", args, want, out)
			}
		}
		if strings.Contains(out, "FAILED") || stderr.Len() > 0 {
			t.Errorf("%v: a check failed:\n%s\nstderr:\n%s", args, out, &stderr)
		}
	}
}

// TestUsage: bad flags exit with status 2 and say why.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-ttl", "100ms"},
		{"-ttl", "1000500us"},
		{"-addr", "127.0.0.1:1883", "-env"},
		{"extra"},
		{"-nosuchflag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%v: exit status %d, want %d", args, code, exitUsage)
		}
		if stderr.Len() == 0 || stdout.Len() > 0 {
			t.Errorf("%v: stdout %q, stderr %q: want only an error on stderr", args, &stdout, &stderr)
		}
	}
}

// TestInterrupted: a run cut short (Ctrl-C) returns at once with status 1
// and leaves nothing behind (TestMain checks for goroutines).
func TestInterrupted(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{50 * time.Millisecond, 700 * time.Millisecond, 1700 * time.Millisecond, 2000 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(t.Context(), after)
		var stdout, stderr bytes.Buffer
		start := time.Now()
		code := run(ctx, []string{"-ttl", "500ms", "-svg", filepath.Join(t.TempDir(), "run.svg")}, &stdout, &stderr)
		cancel()
		if code != exitFailed || !strings.Contains(stderr.String(), "deadline exceeded") {
			t.Errorf("interrupted after %v: exit status %d, stderr %q; want %d and the reason", after, code, &stderr, exitFailed)
		}
		if took := time.Since(start) - after; took > time.Second {
			t.Errorf("interrupted after %v: returned %v later", after, took)
		}
	}
}
