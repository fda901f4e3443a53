package sskv_test

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// funcWatch is a callback watch (WithCallback) whose f and done record
// what they get, and check that f is never called concurrently nor after
// done.
type funcWatch struct {
	t      testing.TB
	w      *sskv.Watcher
	events chan sskv.Event
	ended  chan error
	in     atomic.Int32 // calls of f under way
	dones  atomic.Int32
}

// watchCallback starts a callback watch of key; opts are added to
// WithCallback.
func watchCallback(t testing.TB, c *sskv.Client, ctx context.Context, key string, opts ...sskv.WatchOption) *funcWatch {
	t.Helper()
	fw := &funcWatch{t: t, events: make(chan sskv.Event, 1000), ended: make(chan error, 2)}
	w, err := c.Watch(ctx, key, append(opts, sskv.WithCallback(fw.f, fw.done))...)
	if err != nil {
		t.Fatalf("Watch(%q, WithCallback): %v", key, err)
	}
	fw.w = w
	return fw
}

func (fw *funcWatch) f(ev sskv.Event) {
	if fw.in.Add(1) != 1 {
		fw.t.Error("f called concurrently")
	}
	if fw.dones.Load() != 0 {
		fw.t.Error("f called after done")
	}
	select {
	case fw.events <- ev:
	default:
		fw.t.Error("too many events")
	}
	fw.in.Add(-1)
}

func (fw *funcWatch) done(err error) {
	if fw.in.Load() != 0 {
		fw.t.Error("done called while f runs")
	}
	if fw.dones.Add(1) != 1 {
		fw.t.Error("done called twice")
	}
	fw.ended <- err
}

func (fw *funcWatch) next() sskv.Event {
	fw.t.Helper()
	select {
	case ev := <-fw.events:
		return ev
	case err := <-fw.ended:
		fw.t.Fatalf("watch of %q ended: %v", fw.w.Key(), err)
	case <-time.After(waitTimeout):
		fw.t.Fatalf("no event for %q", fw.w.Key())
	}
	return sskv.Event{}
}

// initial returns the watch's first event, failing unless it is the
// Initial event carrying the state op and value.
func (fw *funcWatch) initial(op sskv.Op, value string) sskv.Event {
	fw.t.Helper()
	ev := fw.next()
	checkInitial(fw.t, ev, fw.w.Key(), op, value)
	return ev
}

func (fw *funcWatch) noEvent() {
	fw.t.Helper()
	select {
	case ev := <-fw.events:
		fw.t.Fatalf("unexpected event %+v", ev)
	default:
	}
}

// end waits for done and returns its error.
func (fw *funcWatch) end() error {
	fw.t.Helper()
	select {
	case err := <-fw.ended:
		return err
	case <-time.After(waitTimeout):
		fw.t.Fatalf("done not called for %q", fw.w.Key())
		return nil
	}
}

// TestCallbackWatchEvents: f gets the state the watch starts from, then
// every change, in version order, one at a time.
func TestCallbackWatchEvents(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)

	s0, err := other.Set(ctx, "k", []byte("before"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fw := watchCallback(t, c, ctx, "k")
	defer fw.w.Stop()
	if fw.w.Key() != "k" || fw.w.Events() != nil {
		t.Fatalf("Key() = %q, Events() = %v", fw.w.Key(), fw.w.Events())
	}
	if ev := fw.initial(sskv.OpSet, "before"); ev.Version != s0.Version {
		t.Fatalf("Initial event %+v; want version %v", ev, s0.Version)
	}
	const n = 200
	var versions []hlc.Timestamp
	for i := 1; i <= n; i++ {
		var err error
		if i%50 == 0 {
			_, err = other.Del(ctx, "k", sskv.DelOptions{})
			versions = append(versions, hlc.Timestamp{})
		} else {
			var r sskv.SetResult
			r, err = other.Set(ctx, "k", []byte(strconv.Itoa(i)), sskv.SetOptions{})
			versions = append(versions, r.Version)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var last hlc.Timestamp
	for i := 1; i <= n; i++ {
		ev := fw.next()
		if ev.Resync || ev.Initial || ev.Key != "k" {
			t.Fatalf("event %d: %+v", i, ev)
		}
		if i%50 == 0 {
			if ev.Op != sskv.OpDelete {
				t.Fatalf("event %d: %+v, want DELETE", i, ev)
			}
		} else if ev.Op != sskv.OpSet || string(ev.Value) != strconv.Itoa(i) || ev.Version != versions[i-1] {
			t.Fatalf("event %d: %+v, want SET %d at %v", i, ev, i, versions[i-1])
		}
		if !ev.Version.After(last) {
			t.Fatalf("event %d: version %v not after %v", i, ev.Version, last)
		}
		last = ev.Version
	}
	fw.noEvent()
}

// TestCallbackWatchResyncAfterReconnect: changes made while the client is
// away are reported by one Resync event once it is back, and the watch goes
// on.
func TestCallbackWatchResyncAfterReconnect(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"app": "good", "writer": "w"}})
	pwFile := filepath.Join(t.TempDir(), "pw")
	writeFile(t, pwFile, "good")
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.PasswordFile = "app", pwFile })
	other := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.Password = "writer", []byte("w") })
	ctx := testCtx(t)

	fw := watchCallback(t, c, ctx, "k")
	defer fw.w.Stop()
	quiet := watchCallback(t, c, ctx, "unchanged")
	defer quiet.w.Stop()
	fw.initial(sskv.OpDelete, "")
	quiet.initial(sskv.OpDelete, "")
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := fw.next(); string(ev.Value) != "v1" {
		t.Fatalf("event %+v", ev)
	}

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

	ev := fw.next()
	if !ev.Resync || ev.Op != sskv.OpSet || string(ev.Value) != "v3" || ev.Version != s3.Version {
		t.Fatalf("event %+v, want Resync SET v3 %v", ev, s3.Version)
	}
	if _, err := other.Set(ctx, "k", []byte("v4"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := fw.next(); ev.Resync || string(ev.Value) != "v4" {
		t.Fatalf("event %+v, want v4", ev)
	}
	quiet.noEvent()
	fw.noEvent()
}

// TestCallbackWatchStop: done(nil) is called once, after which f is not;
// the registration ends with the last watcher; Stop from f works too.
func TestCallbackWatchStop(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)

	fw := watchCallback(t, c, ctx, "k")
	fw.initial(sskv.OpDelete, "")
	fw.w.Stop()
	if err := fw.end(); err != nil {
		t.Fatalf("done(%v) after Stop, want nil", err)
	}
	fw.w.Stop() // idempotent
	if fw.w.Err() != nil {
		t.Fatalf("Err after Stop: %v", fw.w.Err())
	}
	// The STOP goes out in the background.
	eventually(t, "the registration to end with the last watcher", func() bool { return !srv.Watching(c.ID(), "k") })
	if _, err := other.Set(ctx, "k", []byte("after"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}

	// Stop from f, with another watcher of the key that goes on. f may be
	// called with the Initial event before Watch returns: it stops the
	// watch at the first change.
	var self atomic.Pointer[sskv.Watcher]
	got := make(chan sskv.Event, 10)
	ended := make(chan error, 2)
	w, err := c.Watch(ctx, "k", sskv.WithCallback(func(ev sskv.Event) {
		got <- ev
		if !ev.Initial {
			self.Load().Stop()
		}
	}, func(err error) { ended <- err }))
	if err != nil {
		t.Fatal(err)
	}
	self.Store(w)
	if ev := <-got; !ev.Initial || string(ev.Value) != "after" {
		t.Fatalf("first event %+v; want Initial SET after", ev)
	}
	stays := watchCallback(t, c, ctx, "k")
	defer stays.w.Stop()
	stays.initial(sskv.OpSet, "after")
	for _, v := range []string{"a", "b"} {
		if _, err := other.Set(ctx, "k", []byte(v), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if ev := <-got; string(ev.Value) != "a" {
		t.Fatalf("event %+v", ev)
	}
	if err := <-ended; err != nil {
		t.Fatalf("done(%v)", err)
	}
	for _, v := range []string{"a", "b"} {
		if ev := stays.next(); string(ev.Value) != v {
			t.Fatalf("event %+v, want %s", ev, v)
		}
	}
	select {
	case ev := <-got:
		t.Fatalf("event %+v after Stop", ev)
	case err := <-ended:
		t.Fatalf("done called again (%v)", err)
	default:
	}
	if !srv.Watching(c.ID(), "k") {
		t.Fatal("the registration ended while a watcher remains")
	}
}

// TestCallbackWatchEnds: done reports ctx's end and the Client's Close,
// once; a watch that never started reports no end; a nil f is an error.
func TestCallbackWatchEnds(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)

	wctx, cancel := context.WithCancel(context.Background())
	fw := watchCallback(t, c, wctx, "k")
	cancel()
	if err := fw.end(); !errors.Is(err, context.Canceled) {
		t.Fatalf("done(%v), want context.Canceled", err)
	}
	if !errors.Is(fw.w.Err(), context.Canceled) {
		t.Fatalf("Err %v", fw.w.Err())
	}
	eventually(t, "the registration to end", func() bool { return !srv.Watching(c.ID(), "k") })

	fw = watchCallback(t, c, testCtx(t), "k2")
	_ = c.Close()
	if err := fw.end(); !errors.Is(err, sskv.ErrClosed) {
		t.Fatalf("done(%v), want ErrClosed", err)
	}
	fw.w.Stop()
	if fw.dones.Load() != 1 {
		t.Fatalf("done called %d times", fw.dones.Load())
	}

	// A watch that never started reports no end.
	called := false
	_, err := c.Watch(testCtx(t), "k", sskv.WithCallback(func(sskv.Event) {}, func(error) { called = true }))
	if !errors.Is(err, sskv.ErrClosed) || called {
		t.Fatalf("Watch(WithCallback) after Close: %v, done called: %v", err, called)
	}
}

// TestIdleWatchersCostNoGoroutine: watchers that get events as fast as
// they come, or none, run no goroutine of their own.
func TestIdleWatchersCostNoGoroutine(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	before := runtime.NumGoroutine()
	const n = 200
	var fws []*funcWatch
	var ws []*sskv.Watcher
	for i := range n {
		fws = append(fws, watchCallback(t, c, ctx, "f"+strconv.Itoa(i)))
		w, err := c.Watch(ctx, "c"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for i := range n {
		fws[i].initial(sskv.OpDelete, "")
		wantInitial(t, ws[i], sskv.OpDelete, "")
	}
	for i := range n {
		if _, err := other.Set(ctx, "f"+strconv.Itoa(i), []byte("x"), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := other.Set(ctx, "c"+strconv.Itoa(i), []byte("x"), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		fws[i].next()
		nextEvent(t, ws[i])
	}
	// A few goroutines may come and go; 2n watchers must not add n.
	if extra := runtime.NumGoroutine() - before; extra > n/10 {
		t.Fatalf("%d watchers added %d goroutines", 2*n, extra)
	}
	for i := range n {
		fws[i].w.Stop()
		ws[i].Stop()
	}
}

// TestCallbackWatchStopFromFLast: the last watcher of a key stopped from
// its own f, on the goroutine that receives the answers, ends the
// registration without waiting there for the STOP's answer, and the client
// goes on.
func TestCallbackWatchStopFromFLast(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.RequestTimeout = waitTimeout })
	other := dial(t, srv)
	ctx := testCtx(t)

	// f may get the Initial event before Watch returns: it stops the watch
	// at the first change, which comes in on the receiving goroutine.
	var self atomic.Pointer[sskv.Watcher]
	ended := make(chan error, 1)
	w, err := c.Watch(ctx, "k", sskv.WithCallback(func(ev sskv.Event) {
		if !ev.Initial {
			self.Load().Stop()
		}
	}, func(err error) { ended <- err }))
	if err != nil {
		t.Fatal(err)
	}
	self.Store(w)
	start := time.Now()
	if _, err := other.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; err != nil {
		t.Fatalf("done(%v)", err)
	}
	eventually(t, "the registration to end", func() bool { return !srv.Watching(c.ID(), "k") })
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > waitTimeout/2 {
		t.Fatalf("took %v: the STOP waited on the receiving goroutine", took)
	}
	// A new watch of the key registers again.
	fw := watchCallback(t, c, ctx, "k")
	defer fw.w.Stop()
	fw.initial(sskv.OpSet, "v")
	if _, err := other.Set(ctx, "k", []byte("again"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := fw.next(); string(ev.Value) != "again" {
		t.Fatalf("event %+v", ev)
	}
}
