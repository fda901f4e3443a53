package sskv_test

import (
	"context"
	"errors"
	"fmt"
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
	wantInitial(t, w, sskv.OpDelete, "")
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
	for _, want := range []string{"KEYNOTIFY ok", "SET ok", "GET ok", "VDEL refused", "DEL ok", "SET refused", "SET too_large"} {
		if !rec.has(want) {
			t.Errorf("no Request(%s); got %q", want, rec.requests)
		}
	}
	if rec.has("SET service_error") || rec.has("VDEL service_error") {
		t.Errorf("contention counted as a service error: %q", rec.requests)
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

// Each of the store's answers that means "not done" because of the key's
// state is "refused"; the store's other errors are "service_error"; a
// request whose context ends first is "timeout" or "canceled".
func TestMetricsOutcomes(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	var rec recorder
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.Metrics = rec.metrics() })
	other := dial(t, srv)
	ctx := testCtx(t)
	last := func() string {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if len(rec.requests) == 0 {
			return ""
		}
		return rec.requests[len(rec.requests)-1]
	}

	held, err := other.Set(ctx, "held", []byte("other's"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fenced, err := other.Set(ctx, "fenced", []byte("other's"), sskv.SetOptions{FencingToken: held.Version})
	if err != nil {
		t.Fatal(err)
	}
	future, older := fenced.Version, held.Version
	future.Wall += (2 * time.Minute).Milliseconds()
	older.Wall--
	for _, tc := range []struct {
		what string
		do   func() error
		want string
	}{
		{"SET NX of a held key", func() error {
			r, err := c.Set(ctx, "held", []byte("mine"), sskv.SetOptions{Condition: sskv.IfNotExists})
			if err == nil && r.Applied {
				return errors.New("applied")
			}
			return err
		}, "SET refused"},
		{"SET NEX of a held key", func() error {
			_, err := c.Set(ctx, "held", []byte("mine"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists})
			return err
		}, "SET refused"},
		{"SET NEX of its own value", func() error {
			_, err := c.Set(ctx, "held", []byte("other's"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists})
			return err
		}, "SET ok"},
		{"VDEL of another value", func() error {
			_, err := c.VDel(ctx, "held", []byte("mine"), sskv.DelOptions{})
			return err
		}, "VDEL refused"},
		{"VDEL of a missing key", func() error {
			_, err := c.VDel(ctx, "missing", []byte("mine"), sskv.DelOptions{})
			return err
		}, "VDEL ok"},
		{"SET of a fenced key without a token", func() error {
			_, err := c.Set(ctx, "fenced", []byte("mine"), sskv.SetOptions{Condition: sskv.IfNotExists})
			return wantErr(err, sskv.ErrFencingTokenRequired)
		}, "SET refused"},
		{"VDEL of a fenced key with an older token", func() error {
			_, err := c.VDel(ctx, "fenced", []byte("other's"), sskv.DelOptions{FencingToken: older})
			return wantErr(err, sskv.ErrFencingTokenLower)
		}, "VDEL refused"},
		{"DEL of a fenced key without a token", func() error {
			_, err := c.Del(ctx, "fenced", sskv.DelOptions{})
			return wantErr(err, sskv.ErrFencingTokenRequired)
		}, "DEL refused"},
		{"a token two minutes ahead", func() error {
			_, err := c.Set(ctx, "fenced", []byte("mine"), sskv.SetOptions{FencingToken: future})
			return wantErr(err, sskv.ErrFencingTokenSkew)
		}, "SET service_error"},
		{"a deadline passed", func() error {
			dctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
			defer cancel()
			<-dctx.Done()
			_, err := c.Get(dctx, "held")
			return wantErr(err, context.DeadlineExceeded)
		}, "GET timeout"},
		{"a context cancelled", func() error {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err := c.Get(cctx, "held")
			return wantErr(err, context.Canceled)
		}, "GET canceled"},
	} {
		if err := tc.do(); err != nil {
			t.Errorf("%s: %v", tc.what, err)
			continue
		}
		if got := last(); got != tc.want {
			t.Errorf("%s: Request(%s); want %s", tc.what, got, tc.want)
		}
	}
}

// wantErr returns nil if err is target, and an error saying what err was
// otherwise.
func wantErr(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return fmt.Errorf("got %v; want %v", err, target)
}
