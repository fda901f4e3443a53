package sskv_test

import (
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// recorder keeps what the Metrics hooks were called with.
type recorder struct {
	mu       sync.Mutex
	ups      []uint64
	downs    []uint64
	failed   int
	requests []string // "VERB outcome"
	resyncs  []string
}

func (r *recorder) metrics() sskv.Metrics {
	return sskv.Metrics{
		ConnectionUp:   func(n uint64) { r.mu.Lock(); r.ups = append(r.ups, n); r.mu.Unlock() },
		ConnectionDown: func(n uint64, _ error) { r.mu.Lock(); r.downs = append(r.downs, n); r.mu.Unlock() },
		ConnectFailed:  func(error) { r.mu.Lock(); r.failed++; r.mu.Unlock() },
		Request: func(verb string, d time.Duration, outcome string) {
			if d <= 0 {
				panic("non-positive latency")
			}
			r.mu.Lock()
			r.requests = append(r.requests, verb+" "+outcome)
			r.mu.Unlock()
		},
		WatchResync: func(key string) { r.mu.Lock(); r.resyncs = append(r.resyncs, key); r.mu.Unlock() },
	}
}

func (r *recorder) has(what string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.requests, what)
}

// The hooks see the connection come and go, every request with its outcome,
// failed attempts and a watch's Resync.
func TestMetricsHooks(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"app": "good", "writer": "w"}})
	pwFile := filepath.Join(t.TempDir(), "pw")
	writeFile(t, pwFile, "good")
	var rec recorder
	c := dial(t, srv, func(cfg *sskv.Config) {
		cfg.Username, cfg.PasswordFile = "app", pwFile
		cfg.Metrics = rec.metrics()
	})
	other := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.Password = "writer", []byte("w") })
	ctx := testCtx(t)

	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	s, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); string(ev.Value) != "v" {
		t.Fatalf("event %+v; want the Set", ev)
	}
	_, _ = c.Get(ctx, "k")
	_, _ = c.VDel(ctx, "k", []byte("other"), sskv.DelOptions{})
	_, _ = c.Del(ctx, "nothing", sskv.DelOptions{})
	if _, err := other.Set(ctx, "fenced", []byte("v"), sskv.SetOptions{FencingToken: s.Version}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "fenced", []byte("v"), sskv.SetOptions{}); !errors.Is(err, sskv.ErrFencingTokenRequired) {
		t.Fatalf("unfenced Set of a fenced key = %v", err)
	}
	if _, err := c.Set(ctx, "big", make([]byte, 5<<20), sskv.SetOptions{}); !errors.Is(err, sskv.ErrTooLarge) {
		t.Fatalf("5 MiB Set = %v", err)
	}
	for _, want := range []string{"KEYNOTIFY ok", "SET ok", "GET ok", "VDEL ok", "DEL ok", "SET service_error", "SET too_large"} {
		if !rec.has(want) {
			t.Errorf("no Request(%s); got %q", want, rec.requests)
		}
	}

	// Out, kept out for a while, then back: down, failed attempts, up, and
	// a Resync of the key that changed meanwhile.
	writeFile(t, pwFile, "bad")
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failed attempts", func() bool { rec.mu.Lock(); defer rec.mu.Unlock(); return rec.failed > 0 })
	if _, err := other.Set(ctx, "k", []byte("while away"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, pwFile, "good")
	if ev := nextEvent(t, w); !ev.Resync {
		t.Fatalf("event %+v; want a Resync", ev)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !slices.Equal(rec.ups, []uint64{1, 2}) || !slices.Equal(rec.downs, []uint64{1}) {
		t.Errorf("ConnectionUp %v, ConnectionDown %v; want [1 2] and [1]", rec.ups, rec.downs)
	}
	if !slices.Equal(rec.resyncs, []string{"k"}) {
		t.Errorf("WatchResync %q; want [k]", rec.resyncs)
	}
}
