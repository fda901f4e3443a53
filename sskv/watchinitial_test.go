package sskv_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// watchEvents is one watch, a channel watcher or a callback watcher, read
// the same way.
type watchEvents interface {
	next(t testing.TB) sskv.Event
	none(t testing.TB)
	stop()
}

type chanWatch struct{ w *sskv.Watcher }

func (cw chanWatch) next(t testing.TB) sskv.Event { t.Helper(); return nextEvent(t, cw.w) }
func (cw chanWatch) none(t testing.TB)            { t.Helper(); noEvent(t, cw.w) }
func (cw chanWatch) stop()                        { cw.w.Stop() }

type cbWatch struct{ fw *funcWatch }

func (cb cbWatch) next(t testing.TB) sskv.Event { t.Helper(); return cb.fw.next() }
func (cb cbWatch) none(t testing.TB)            { t.Helper(); cb.fw.noEvent() }
func (cb cbWatch) stop()                        { cb.fw.w.Stop() }

// watchKinds starts a watch of key of each kind.
var watchKinds = []struct {
	name  string
	watch func(t *testing.T, c *sskv.Client, ctx context.Context, key string) watchEvents
}{
	{"chan", func(t *testing.T, c *sskv.Client, ctx context.Context, key string) watchEvents {
		t.Helper()
		w, err := c.Watch(ctx, key)
		if err != nil {
			t.Fatalf("Watch(%q): %v", key, err)
		}
		return chanWatch{w}
	}},
	{"callback", func(t *testing.T, c *sskv.Client, ctx context.Context, key string) watchEvents {
		t.Helper()
		return cbWatch{watchCallback(t, c, ctx, key)}
	}},
}

// TestWatchInitialEvent: the first event of a watch is the key's state when
// the watch was registered: the value and version a Get reads, or, for a
// missing key, a deletion with no version.
func TestWatchInitialEvent(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	if _, err := other.Set(ctx, "there", []byte("value"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	g, err := c.Get(ctx, "there")
	if err != nil || !g.Found {
		t.Fatalf("Get: %+v, %v", g, err)
	}
	for _, kind := range watchKinds {
		t.Run(kind.name, func(t *testing.T) {
			w := kind.watch(t, c, ctx, "there")
			defer w.stop()
			ev := w.next(t)
			checkInitial(t, ev, "there", sskv.OpSet, "value")
			if ev.Version != g.Version {
				t.Fatalf("Initial event at %v; Get read version %v", ev.Version, g.Version)
			}

			missing := kind.watch(t, c, ctx, "missing-"+kind.name)
			defer missing.stop()
			checkInitial(t, missing.next(t), "missing-"+kind.name, sskv.OpDelete, "")

			// Then the changes, none of them Initial.
			s, err := other.Set(ctx, "there", []byte("next"), sskv.SetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ev := w.next(t); ev.Initial || ev.Resync || ev.Op != sskv.OpSet || string(ev.Value) != "next" || ev.Version != s.Version {
				t.Fatalf("event %+v; want the SET of next at %v", ev, s.Version)
			}
			if _, err := other.Set(ctx, "there", []byte("value"), sskv.SetOptions{}); err != nil {
				t.Fatal(err)
			}
			if ev := w.next(t); ev.Initial || string(ev.Value) != "value" {
				t.Fatalf("event %+v; want the SET of value", ev)
			}
			g, err = c.Get(ctx, "there") // the state the next kind's watch starts from
			if err != nil {
				t.Fatal(err)
			}
			w.none(t)
			missing.none(t)
		})
	}
}

// TestWatchJoinGetsLatestState: a watcher joining a registration that
// other watchers share starts from the latest state the registration
// knows, then gets the same later changes as the others, none twice.
func TestWatchJoinGetsLatestState(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	for _, kind := range watchKinds {
		t.Run(kind.name, func(t *testing.T) {
			key := "k-" + kind.name
			first := chanWatch{w: mustWatch(t, c, ctx, key)}
			defer first.stop()
			checkInitial(t, first.next(t), key, sskv.OpDelete, "")
			var last sskv.SetResult
			for _, v := range []string{"a", "b", "c"} {
				var err error
				if last, err = other.Set(ctx, key, []byte(v), sskv.SetOptions{}); err != nil {
					t.Fatal(err)
				}
				if ev := first.next(t); string(ev.Value) != v {
					t.Fatalf("first watcher: %+v, want %s", ev, v)
				}
			}

			joined := kind.watch(t, c, ctx, key)
			defer joined.stop()
			ev := joined.next(t)
			checkInitial(t, ev, key, sskv.OpSet, "c")
			if ev.Version != last.Version {
				t.Fatalf("Initial event at %v; want the last SET's %v", ev.Version, last.Version)
			}
			if !srv.Watching(c.ID(), key) {
				t.Fatal("no watch registered")
			}

			d, err := other.Set(ctx, key, []byte("d"), sskv.SetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.Del(ctx, key, sskv.DelOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, w := range []watchEvents{first, joined} {
				if ev := w.next(t); ev.Initial || ev.Resync || string(ev.Value) != "d" || ev.Version != d.Version {
					t.Fatalf("event %+v; want the SET of d at %v", ev, d.Version)
				}
				if ev := w.next(t); ev.Initial || ev.Resync || ev.Op != sskv.OpDelete || !ev.Version.After(d.Version) {
					t.Fatalf("event %+v; want the deletion after %v", ev, d.Version)
				}
			}
			reconnected(t, c) // a round trip on the connection: any notification left is in
			first.none(t)
			joined.none(t)
		})
	}
}

// mustWatch starts a channel watch of key.
func mustWatch(t testing.TB, c *sskv.Client, ctx context.Context, key string, opts ...sskv.WatchOption) *sskv.Watcher {
	t.Helper()
	w, err := c.Watch(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Watch(%q): %v", key, err)
	}
	return w
}

// TestWatchJoinDuringResync: watchers that join a registration while it is
// being restored after a reconnect get, as their Initial event, the state
// that restore reads, once; the watcher that was there gets it as a
// Resync; then all get the same changes.
func TestWatchJoinDuringResync(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	old := chanWatch{w: mustWatch(t, c, ctx, "k")}
	defer old.stop()
	checkInitial(t, old.next(t), "k", sskv.OpSet, "v1")

	// Hold the first restore of k before its KEYNOTIFY.
	inSync := make(chan struct{})
	resume := make(chan struct{})
	var once, resumeOnce sync.Once
	sskv.SetSyncHookForTest(c, func(key string) {
		if key == "k" {
			once.Do(func() {
				close(inSync)
				<-resume
			})
		}
	})
	release := func() { resumeOnce.Do(func() { close(resume) }) }
	defer release()
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	<-inSync
	v2, err := other.Set(ctx, "k", []byte("v2"), sskv.SetOptions{}) // while k is not watched on the store
	if err != nil {
		t.Fatal(err)
	}
	if _, resyncing := sskv.KnownForTest(c, "k"); !resyncing {
		t.Fatal("the registration is not resyncing")
	}
	joinedChan := chanWatch{w: mustWatch(t, c, ctx, "k")}
	defer joinedChan.stop()
	joinedCb := cbWatch{watchCallback(t, c, ctx, "k")}
	defer joinedCb.stop()
	// Nothing yet: the restore has not read the key.
	joinedChan.none(t)
	joinedCb.none(t)
	old.none(t)

	release()
	if ev := old.next(t); !ev.Resync || ev.Initial || string(ev.Value) != "v2" || ev.Version != v2.Version {
		t.Fatalf("old watcher: %+v; want a Resync to v2 at %v", ev, v2.Version)
	}
	for _, w := range []watchEvents{joinedChan, joinedCb} {
		ev := w.next(t)
		checkInitial(t, ev, "k", sskv.OpSet, "v2")
		if ev.Version != v2.Version {
			t.Fatalf("Initial event at %v; want v2's %v", ev.Version, v2.Version)
		}
	}
	eventually(t, "the restore to end", func() bool { _, resyncing := sskv.KnownForTest(c, "k"); return !resyncing })
	v3, err := other.Set(ctx, "k", []byte("v3"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []watchEvents{old, joinedChan, joinedCb} {
		if ev := w.next(t); ev.Initial || ev.Resync || string(ev.Value) != "v3" || ev.Version != v3.Version {
			t.Fatalf("event %+v; want the SET of v3 at %v", ev, v3.Version)
		}
	}
	reconnected(t, c)
	for _, w := range []watchEvents{old, joinedChan, joinedCb} {
		w.none(t)
	}
}

// TestWatchJoinDuringResyncMissing: as TestWatchJoinDuringResync, for a
// key deleted while the client was away: the joining watcher starts from
// its absence, with no version.
func TestWatchJoinDuringResyncMissing(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	old := chanWatch{w: mustWatch(t, c, ctx, "k")}
	defer old.stop()
	checkInitial(t, old.next(t), "k", sskv.OpSet, "v1")

	inSync := make(chan struct{})
	resume := make(chan struct{})
	var once, resumeOnce sync.Once
	sskv.SetSyncHookForTest(c, func(key string) {
		if key == "k" {
			once.Do(func() {
				close(inSync)
				<-resume
			})
		}
	})
	release := func() { resumeOnce.Do(func() { close(resume) }) }
	defer release()
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	<-inSync
	if _, err := other.Del(ctx, "k", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	joined := cbWatch{watchCallback(t, c, ctx, "k")}
	defer joined.stop()
	release()
	if ev := old.next(t); !ev.Resync || ev.Op != sskv.OpDelete || !ev.Version.IsZero() {
		t.Fatalf("old watcher: %+v; want a Resync deletion with no version", ev)
	}
	checkInitial(t, joined.next(t), "k", sskv.OpDelete, "")
	reconnected(t, c)
	old.none(t)
	joined.none(t)
}

// TestNoEventRepeatsInitialState: a reconnect with no change to the key
// delivers nothing: neither the Initial state again nor an empty Resync.
func TestNoEventRepeatsInitialState(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	if _, err := other.Set(ctx, "set", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	var ws []watchEvents
	for _, kind := range watchKinds {
		for _, key := range []string{"set", "missing"} {
			w := kind.watch(t, c, ctx, key)
			defer w.stop()
			if key == "set" {
				checkInitial(t, w.next(t), key, sskv.OpSet, "v")
			} else {
				checkInitial(t, w.next(t), key, sskv.OpDelete, "")
			}
			ws = append(ws, w)
		}
	}
	for range 2 {
		if err := srv.Kick(c.ID()); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the watches to be restored", func() bool {
			for _, key := range []string{"set", "missing"} {
				if _, resyncing := sskv.KnownForTest(c, key); resyncing || !srv.Watching(c.ID(), key) {
					return false
				}
			}
			return true
		})
		reconnected(t, c)
		for _, w := range ws {
			w.none(t)
		}
	}
	// The next change is delivered as such, once.
	if _, err := other.Set(ctx, "set", []byte("w"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		if i%2 == 0 { // the watchers of "set"
			if ev := w.next(t); ev.Initial || ev.Resync || string(ev.Value) != "w" {
				t.Fatalf("event %+v; want the SET of w", ev)
			}
		}
	}
	reconnected(t, c)
	for _, w := range ws {
		w.none(t)
	}
}

// TestWatchOptionErrors: a nil callback is refused with an error, before
// anything is registered; so is a key too long, whatever the options.
func TestWatchOptionErrors(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	before := srv.Requests(c.ID())
	for _, opts := range [][]sskv.WatchOption{
		{sskv.WithCallback(nil, nil)},
		{sskv.WithCallback(nil, func(error) { t.Error("done called") })},
		{sskv.Detached(), sskv.WithCallback(nil, nil)},
	} {
		w, err := c.Watch(ctx, "k", opts...)
		if err == nil || w != nil || !strings.Contains(err.Error(), "nil function") {
			t.Fatalf("Watch with a nil callback = %v, %v; want an error saying the function is nil", w, err)
		}
	}
	long := strings.Repeat("k", c.MaxWatchKey()+1)
	for _, opts := range [][]sskv.WatchOption{
		nil,
		{sskv.Detached()},
		{sskv.WithCallback(func(sskv.Event) {}, nil)},
		{sskv.WithCallback(func(sskv.Event) {}, nil), sskv.Detached()},
	} {
		if _, err := c.Watch(ctx, long, opts...); !errors.Is(err, sskv.ErrKeyTooLong) {
			t.Fatalf("Watch of a %d-byte key with %d options = %v; want ErrKeyTooLong", len(long), len(opts), err)
		}
	}
	if n := srv.Requests(c.ID()) - before; n != 0 {
		t.Fatalf("%d requests sent for refused watches", n)
	}
	if srv.Watching(c.ID(), "k") {
		t.Fatal("a refused watch is registered")
	}
}

// TestWatchEndedBeforeSyncSendsNothing: a watch whose context ended before
// its KEYNOTIFY could go out sends nothing, not even a KEYNOTIFY STOP (a
// FenceKey holding released at once ends its guard's watch so), and the
// key can be watched again at once.
func TestWatchEndedBeforeSyncSendsNothing(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	before := srv.Requests(c.ID())
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if w, err := c.Watch(ended, "k"); !errors.Is(err, context.Canceled) || w != nil {
		t.Fatalf("Watch with an ended context = %v, %v; want context.Canceled", w, err)
	}
	// Its end goes on in the background: once its registration is gone, the
	// next watch of the key waits for the rest of it (a STOP, if it sent
	// one), then sends its KEYNOTIFY and GET.
	eventually(t, "the ended watch's registration to go", func() bool { return !sskv.RegisteredForTest(c, "k") })
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := nextEvent(t, w); !ev.Initial || ev.Op != sskv.OpDelete {
		t.Fatalf("first event %+v; want the initial state of a missing key", ev)
	}
	if n := srv.Requests(c.ID()) - before; n != 2 {
		t.Fatalf("%d requests for a watch that ended before its sync and one that started; want 2 (KEYNOTIFY, GET)", n)
	}
}
