package sskv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestWatchEvents(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)

	s0, err := other.Set(ctx, "k", []byte("before"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if w.Key() != "k" {
		t.Fatalf("Key() = %q", w.Key())
	}
	// First the state the watch starts from, then each change.
	if ev := wantInitial(t, w, sskv.OpSet, "before"); ev.Version != s0.Version {
		t.Fatalf("Initial event %+v; want version %v", ev, s0.Version)
	}
	s1, _ := other.Set(ctx, "k", []byte("one"), sskv.SetOptions{})
	s2, _ := other.Set(ctx, "k", []byte("two"), sskv.SetOptions{})
	if _, err := other.Del(ctx, "k", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	s3, _ := other.Set(ctx, "k", []byte("three"), sskv.SetOptions{})
	if _, err := other.VDel(ctx, "k", []byte("three"), sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op      sskv.Op
		value   string
		version hlc.Timestamp
	}{{sskv.OpSet, "one", s1.Version}, {sskv.OpSet, "two", s2.Version}, {sskv.OpDelete, "", hlc.Timestamp{}},
		{sskv.OpSet, "three", s3.Version}, {sskv.OpDelete, "", hlc.Timestamp{}}}
	var last hlc.Timestamp
	for i, wv := range want {
		ev := nextEvent(t, w)
		if ev.Key != "k" || ev.Op != wv.op || string(ev.Value) != wv.value || ev.Resync || ev.Initial {
			t.Fatalf("event %d: %+v, want %v %q", i, ev, wv.op, wv.value)
		}
		if !wv.version.IsZero() && ev.Version != wv.version {
			t.Fatalf("event %d: version %v, want %v", i, ev.Version, wv.version)
		}
		if !ev.Version.After(last) {
			t.Fatalf("event %d: version %v not after %v", i, ev.Version, last)
		}
		last = ev.Version
	}
	noEvent(t, w)
}

// TestWatchSharedRegistration: watchers of one key share one registration,
// which ends only when the last of them stops.
func TestWatchSharedRegistration(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)

	w1, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !srv.Watching(c.ID(), "k") {
		t.Fatal("no watch registered")
	}
	wantInitial(t, w1, sskv.OpDelete, "")
	wantInitial(t, w2, sskv.OpDelete, "")
	if _, err := other.Set(ctx, "k", []byte("a"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*sskv.Watcher{w1, w2} {
		if ev := nextEvent(t, w); string(ev.Value) != "a" {
			t.Fatalf("event %+v", ev)
		}
	}
	w1.Stop()
	if _, ok := <-w1.Events(); ok {
		t.Fatal("channel of a stopped watcher is open")
	}
	if w1.Err() != nil {
		t.Fatalf("Err after Stop: %v", w1.Err())
	}
	w1.Stop() // idempotent
	if !srv.Watching(c.ID(), "k") {
		t.Fatal("the registration ended while a watcher remains")
	}
	if _, err := other.Set(ctx, "k", []byte("b"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w2); string(ev.Value) != "b" {
		t.Fatalf("event %+v", ev)
	}
	w2.Stop()
	if srv.Watching(c.ID(), "k") {
		t.Fatal("the registration outlived the last watcher")
	}

	// A new watch after the last one stopped registers again.
	w3, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Stop()
	if !srv.Watching(c.ID(), "k") {
		t.Fatal("no watch registered")
	}
	wantInitial(t, w3, sskv.OpSet, "b")
}

func TestWatchEnds(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)

	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantInitial(t, w, sskv.OpDelete, "")
	cancel()
	if _, ok := <-w.Events(); ok {
		t.Fatal("event after the context ended")
	}
	if !errors.Is(w.Err(), context.Canceled) {
		t.Fatalf("Err %v", w.Err())
	}
	eventually(t, "the registration to end", func() bool { return !srv.Watching(c.ID(), "k") })

	w, err = c.Watch(testCtx(t), "k2")
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, ok := <-w.Events(); ok {
		t.Fatal("event after Close")
	}
	if !errors.Is(w.Err(), sskv.ErrClosed) {
		t.Fatalf("Err %v", w.Err())
	}
	if _, err := c.Watch(testCtx(t), "k"); !errors.Is(err, sskv.ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}

// TestWatchResyncAfterReconnect: changes made while the client is away are
// reported by one Resync event once it is back.
func TestWatchResyncAfterReconnect(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"app": "good", "writer": "w"}})
	pwFile := filepath.Join(t.TempDir(), "pw")
	writeFile(t, pwFile, "good")
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.PasswordFile = "app", pwFile })
	other := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.Password = "writer", []byte("w") })
	ctx := testCtx(t)

	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	quiet, err := c.Watch(ctx, "unchanged")
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	wantInitial(t, quiet, sskv.OpDelete, "")
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Initial || string(ev.Value) != "v1" {
		t.Fatalf("event %+v", ev)
	}

	// Keep the client out (its password is wrong now) while the key changes.
	writeFile(t, pwFile, "bad")
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to end with the connection", func() bool { return !srv.Watching(c.ID(), "k") })
	if _, err := other.Set(ctx, "k", []byte("v2"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	s3, err := other.Set(ctx, "k", []byte("v3"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, pwFile, "good")

	ev := nextEvent(t, w)
	if !ev.Resync || ev.Initial || ev.Op != sskv.OpSet || string(ev.Value) != "v3" || ev.Version != s3.Version {
		t.Fatalf("event %+v, want Resync SET v3 %v", ev, s3.Version)
	}
	// Live again; the unchanged key got no resync.
	if _, err := other.Set(ctx, "k", []byte("v4"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Resync || string(ev.Value) != "v4" {
		t.Fatalf("event %+v, want v4", ev)
	}
	noEvent(t, quiet)

	// A deletion while away is reported too.
	writeFile(t, pwFile, "bad")
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to end with the connection", func() bool { return !srv.Watching(c.ID(), "k") })
	if _, err := other.Del(ctx, "k", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, pwFile, "good")
	if ev := nextEvent(t, w); !ev.Resync || ev.Op != sskv.OpDelete || ev.Value != nil || !ev.Version.IsZero() {
		t.Fatalf("event %+v, want Resync DELETE with no version (the deletion time is unknown)", ev)
	}
	noEvent(t, quiet)
}

// TestWatchUnderWritesAndKicks: while another client keeps writing, the
// watcher's client is kicked repeatedly; its events stay in version order
// and end with the final value.
func TestWatchUnderWritesAndKicks(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)

	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	const n = 300
	writes := make(chan error, 1)
	go func() {
		for i := 1; i <= n; i++ {
			if _, err := other.Set(ctx, "k", []byte(strconv.Itoa(i)), sskv.SetOptions{}); err != nil {
				writes <- err
				return
			}
			if i%60 == 0 {
				_ = srv.Kick(c.ID())
			}
		}
		writes <- nil
	}()
	var last hlc.Timestamp
	for {
		ev := nextEvent(t, w)
		if !ev.Version.After(last) {
			t.Fatalf("event %+v not after %v", ev, last)
		}
		last = ev.Version
		if string(ev.Value) == strconv.Itoa(n) {
			break
		}
	}
	if err := <-writes; err != nil {
		t.Fatal(err)
	}
}

// TestSlowWatcher: a watcher that does not read neither blocks the client
// nor loses the final state; its overflow becomes one Resync event.
func TestSlowWatcher(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.WatchBuffer = 4 })
	other := dial(t, srv)
	ctx := testCtx(t)

	slow, err := c.Watch(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Stop()
	fast, err := c.Watch(ctx, "fast")
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Stop()
	wantInitial(t, slow, sskv.OpDelete, "")
	wantInitial(t, fast, sskv.OpDelete, "")

	const n = 100
	for i := 1; i <= n; i++ {
		if _, err := other.Set(ctx, "slow", []byte(strconv.Itoa(i)), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The connection is not stalled: requests and other watchers go on.
	if _, err := c.Set(ctx, "fast", []byte("x"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, fast); string(ev.Value) != "x" {
		t.Fatalf("fast watcher: %+v", ev)
	}
	if g, err := c.Get(ctx, "slow"); err != nil || string(g.Value) != strconv.Itoa(n) {
		t.Fatalf("Get: %+v, %v", g, err)
	}

	var got, resyncs int
	var last hlc.Timestamp
	for {
		ev := nextEvent(t, slow)
		got++
		if ev.Resync {
			resyncs++
		}
		if !ev.Version.After(last) {
			t.Fatalf("event %+v not after %v", ev, last)
		}
		last = ev.Version
		if string(ev.Value) == strconv.Itoa(n) {
			break
		}
	}
	if resyncs == 0 || got >= n {
		t.Fatalf("%d events, %d resyncs: the overflow was not coalesced", got, resyncs)
	}
	t.Logf("%d changes delivered as %d events (%d resync)", n, got, resyncs)
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A detached watch outlives the context of its registration: it reports
// changes after that context ended, and ends with Stop; so does a detached
// callback watch.
func TestWatchDetachedOutlivesContext(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)

	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, "k", sskv.Detached())
	if err != nil {
		t.Fatal(err)
	}
	fw := watchCallback(t, c, ctx, "k", sskv.Detached())
	cancel()
	wantInitial(t, w, sskv.OpDelete, "")
	fw.initial(sskv.OpDelete, "")
	if _, err := other.Set(testCtx(t), "k", []byte("after"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Op != sskv.OpSet || string(ev.Value) != "after" {
		t.Fatalf("event %+v, want the SET made after the context ended", ev)
	}
	if ev := fw.next(); ev.Op != sskv.OpSet || string(ev.Value) != "after" {
		t.Fatalf("callback event %+v, want the SET made after the context ended", ev)
	}
	w.Stop()
	if _, ok := <-w.Events(); ok {
		t.Fatal("event after Stop")
	}
	if w.Err() != nil {
		t.Fatalf("Err after Stop = %v, want nil", w.Err())
	}
	fw.w.Stop() // returns once f has returned for the last time
	if err := fw.end(); err != nil {
		t.Fatalf("done(%v) after Stop, want nil", err)
	}
	fw.noEvent()
	eventually(t, "the registration to end", func() bool { return !srv.Watching(c.ID(), "k") })
}
