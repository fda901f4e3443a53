package sskv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// What a resumed session may send again. The client reaches the store
// through a fault proxy: Blackhole swallows what the client sends (the
// PUBLISH stays unacknowledged in its MQTT session), Cut ends the connection,
// and the client's slow reconnect leaves time to act while it is away. When
// it comes back it resumes its session, and MQTT has it resend every
// unacknowledged PUBLISH.

// slowReconnect keeps a client away for about 300 ms after it loses its
// connection.
func slowReconnect(cfg *sskv.Config) {
	cfg.ReconnectMin, cfg.ReconnectMax = 300*time.Millisecond, 300*time.Millisecond
}

// swallow freezes the client's connection, runs send (which must put a
// request in flight), and cuts the connection.
func swallow(t *testing.T, p *faultproxy.Proxy, c *sskv.Client, send func()) {
	t.Helper()
	p.Blackhole()
	send()
	p.Cut()
}

// awayClient returns a store, and a client that reaches it through a fault
// proxy and reconnects slowly, connected.
func awayClient(t *testing.T) (*localstore.Server, *faultproxy.Proxy, *sskv.Client) {
	t.Helper()
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p), slowReconnect)
	reconnected(t, c)
	return srv, p, c
}

// reconnected waits until c has reconnected and the store has handled what
// it resent: a request made now is executed after them.
func reconnected(t *testing.T, c *sskv.Client) {
	t.Helper()
	if _, err := c.Get(testCtx(t), "sync-marker"); err != nil {
		t.Fatal(err)
	}
}

// TestAbandonedRequestNotResent: a SET whose caller gave up while it was
// stuck is not executed when the session is resumed, whereas one whose
// caller still waits is.
func TestAbandonedRequestNotResent(t *testing.T) {
	_, p, c := awayClient(t)
	ctx := testCtx(t)

	waiting := make(chan error, 1)
	swallow(t, p, c, func() {
		rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := c.Set(rctx, "abandoned", []byte("late"), sskv.SetOptions{})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Set on a frozen connection: %v, want a timeout", err)
		}
		go func() {
			_, err := c.Set(ctx, "awaited", []byte("v"), sskv.SetOptions{})
			waiting <- err
		}()
		eventually(t, "the second SET to be in flight", func() bool { return sskv.PendingForTest(c) == 1 })
	})
	if err := <-waiting; err != nil {
		t.Fatalf("a SET whose caller waits across the reconnect: %v", err)
	}
	reconnected(t, c)
	if g, err := c.Get(ctx, "abandoned"); err != nil || g.Found {
		t.Fatalf("the abandoned SET was executed after the reconnect: %+v %v", g, err)
	}
	if g, err := c.Get(ctx, "awaited"); err != nil || !g.Found {
		t.Fatalf("the awaited SET: %+v %v", g, err)
	}
}

// TestConnBoundRequests: a request through a Conn goes out on that
// connection or not at all. One in flight when it is lost fails with
// ErrConnectionLost and is not sent again; one made after fails with
// ErrNotSent at once; neither is executed.
func TestConnBoundRequests(t *testing.T) {
	_, p, c := awayClient(t)
	ctx := testCtx(t)
	cn, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cn.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}

	inFlight := make(chan error, 1)
	swallow(t, p, c, func() {
		go func() {
			_, err := cn.Set(ctx, "k", []byte("v2"), sskv.SetOptions{})
			inFlight <- err
		}()
		eventually(t, "the bound SET to be in flight", func() bool { return sskv.PendingForTest(c) == 1 })
	})
	select {
	case <-cn.Done():
	case <-ctx.Done():
		t.Fatal("Conn.Done not closed after the connection was cut")
	}
	if _, err := cn.Get(ctx, "k"); !errors.Is(err, sskv.ErrNotSent) {
		t.Fatalf("Get through a lost Conn: %v, want ErrNotSent", err)
	}
	if err := <-inFlight; !errors.Is(err, sskv.ErrConnectionLost) {
		t.Fatalf("a bound SET in flight across a reconnect: %v, want ErrConnectionLost", err)
	}
	reconnected(t, c)
	if g, err := c.Get(ctx, "k"); err != nil || string(g.Value) != "v1" {
		t.Fatalf("key after the reconnect: %q %v, want v1 (the bound SET must not be resent)", g.Value, err)
	}
	next, err := c.Connection(ctx)
	if err != nil || next == cn || next.Number() <= cn.Number() {
		t.Fatalf("Connection after a reconnect: %v %v", next, err)
	}
	if _, err := next.Set(ctx, "k", []byte("v3"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestAbandonedWatchNotRegistered: a Watch given up while its KEYNOTIFY was
// stuck and the client disconnected leaves no watch on the store once the
// client is back (the resumed session used to register it again, and the
// store then notified a client that had no Watcher).
func TestAbandonedWatchNotRegistered(t *testing.T) {
	srv, p, c := awayClient(t)
	ctx := testCtx(t)

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	swallow(t, p, c, func() {
		go func() {
			_, err := c.Watch(wctx, "k")
			done <- err
		}()
		eventually(t, "the KEYNOTIFY to be in flight", func() bool { return sskv.PendingForTest(c) == 1 })
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch: %v, want context.Canceled", err)
	}
	reconnected(t, c)
	if srv.Watching(c.ID(), "k") {
		t.Fatal("the store watches k for the client after it gave the watch up")
	}
}

// TestStopDuringResync: a Watcher stopped while its registration is being
// restored after a reconnect leaves no watch on the store, whichever of the
// resync's KEYNOTIFY and the Stop's KEYNOTIFY STOP is sent first.
func TestStopDuringResync(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	inSync := make(chan struct{}, 1)
	resume := make(chan struct{})
	sskv.SetSyncHookForTest(c, func(string) {
		inSync <- struct{}{}
		<-resume
	})
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	<-inSync // the resync found the watch live and is about to register it
	stopped := make(chan struct{})
	go func() {
		w.Stop()
		close(stopped)
	}()
	eventually(t, "Stop to end the registration", func() bool { return !sskv.RegisteredForTest(c, "k") })
	close(resume)
	<-stopped
	reconnected(t, c)
	if srv.Watching(c.ID(), "k") {
		t.Fatal("the store watches k after the Watcher was stopped")
	}
}

// TestSyncMissRacesNotification: the GET that learns a watched key's state
// answers "not found" late, after the notification of a SET made once the
// GET had run. The watch must not take the late "not found" for the latest
// state: it would then drop the key's next deletion as a no-op.
func TestSyncMissRacesNotification(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	other := dial(t, srv)
	ctx := testCtx(t)
	reconnected(t, c)
	base := srv.Requests(c.ID())
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{Delay: 400 * time.Millisecond})

	watched := make(chan *sskv.Watcher, 1)
	go func() {
		w, err := c.Watch(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		watched <- w
	}()
	// KEYNOTIFY, then GET: once the store has run the GET, set the key. Its
	// notification arrives at once; the GET's answer 400 ms later.
	eventually(t, "the sync's GET to run", func() bool { return srv.Requests(c.ID()) == base+2 })
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	w := <-watched
	if w == nil {
		t.FailNow()
	}
	defer w.Stop()
	// The watch starts from v1, not from the late "not found".
	wantInitial(t, w, sskv.OpSet, "v1")
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{})
	d, err := other.Del(ctx, "k", sskv.DelOptions{})
	if err != nil || !d.Deleted {
		t.Fatalf("Del: %+v %v", d, err)
	}
	if ev := nextEvent(t, w); ev.Op != sskv.OpDelete {
		t.Fatalf("event %+v, want the deletion of k", ev)
	}
}

// TestNoRepeatedResync: a watcher that overflowed gets its Resync while the
// client is restoring the watch after a reconnect; when the restore ends
// with the same state, the watcher is not told it a second time.
func TestNoRepeatedResync(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.WatchBuffer = 1 })
	other := dial(t, srv)
	ctx := testCtx(t)
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	var last sskv.SetResult
	for _, v := range []string{"v1", "v2", "v3"} { // w reads nothing: v2 and v3 overflow
		if last, err = other.Set(ctx, "k", []byte(v), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the client to learn v3", func() bool { v, _ := sskv.KnownForTest(c, "k"); return v == last.Version })

	// Reconnect with slow answers, and change the key while the watch is
	// being restored: the client learns v4 from its notification.
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{Delay: 400 * time.Millisecond})
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to be registered again", func() bool { return srv.Watching(c.ID(), "k") })
	v4, err := other.Set(ctx, "k", []byte("v4"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the client to learn v4", func() bool { v, _ := sskv.KnownForTest(c, "k"); return v == v4.Version })
	ev := nextEvent(t, w)
	for !ev.Resync && (string(ev.Value) == "v1" || string(ev.Value) == "v2") { // what the buffer held
		ev = nextEvent(t, w)
	}
	if !ev.Resync || string(ev.Value) != "v4" {
		t.Fatalf("event %+v, want Resync v4", ev)
	}
	eventually(t, "the restore to end", func() bool { _, resyncing := sskv.KnownForTest(c, "k"); return !resyncing })
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{})
	if _, err := other.Set(ctx, "k", []byte("v5"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); ev.Resync || string(ev.Value) != "v5" {
		t.Fatalf("event %+v, want v5 (the Resync to v4 was delivered already)", ev)
	}
}

// TestStaleNotificationAfterResync: notifications the store had sent before
// a disconnect, and that the resumed session delivers again after the
// reconnect, are older than the read that restores the watch: they come
// before its answer, in the connection's order, and cannot pass for news
// after it. Here the key is set and then deleted while the watcher's
// traffic is held; the watcher ends knowing the key is gone, and a later
// SET is reported as the next change.
func TestStaleNotificationAfterResync(t *testing.T) {
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
	if _, err := other.Set(ctx, "k", []byte("v1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); string(ev.Value) != "v1" {
		t.Fatalf("event %+v", ev)
	}
	if err := srv.Hold(c.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Set(ctx, "k", []byte("v2"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Del(ctx, "k", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Drop(c.ID()); err != nil {
		t.Fatal(err)
	}
	// Whatever the resumed session delivers, the watcher's last word on k
	// before the next change is that it is gone.
	var last sskv.Event
	for {
		ev := nextEvent(t, w)
		if !ev.Resync && string(ev.Value) == "v3" {
			break
		}
		last = ev
		t.Logf("event %+v", ev)
		if ev.Op == sskv.OpDelete {
			if _, err := other.Set(ctx, "k", []byte("v3"), sskv.SetOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if last.Op != sskv.OpDelete {
		t.Fatalf("the last event before v3 was %+v; want the deletion", last)
	}
}

// TestBoundAnswerFromResumedSession: a request bound to a connection that
// was executed, but whose answer was held when the connection dropped, gets
// that answer from the resumed session: it is not failed as lost before the
// client has routed what the session brought. (Each round has a client of
// its own, so that nothing of an earlier round is in flight when the
// store's writes to it are held.)
func TestBoundAnswerFromResumedSession(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	other := dial(t, srv)
	ctx := testCtx(t)
	for i := range 100 {
		// No keep-alive ping in the way: a PINGRESP held with the responses
		// would stop the store reading the connection.
		c := dial(t, srv, func(cfg *sskv.Config) { cfg.KeepAlive = time.Minute })
		cn, err := c.Connection(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Hold(c.ID(), localstore.FromStore); err != nil {
			t.Fatal(err)
		}
		value := fmt.Sprint(i)
		done := make(chan error, 1)
		go func() {
			_, err := cn.Set(ctx, "k", []byte(value), sskv.SetOptions{})
			done <- err
		}()
		eventually(t, "the SET to be applied", func() bool {
			g, err := other.Get(ctx, "k")
			return err == nil && string(g.Value) == value
		})
		if err := srv.Drop(c.ID()); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: an executed bound SET whose answer the resumed session delivers: %v", i, err)
		}
		_ = c.Close()
	}
}

// TestEndedContextNotSent: a request whose context has ended is not sent.
func TestEndedContextNotSent(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	cn, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := srv.Requests(c.ID())
	ended, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	if _, err := cn.Set(ended, "bound", []byte("v"), sskv.SetOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bound Set with an ended context: %v", err)
	}
	if _, err := c.Set(ended, "unbound", []byte("v"), sskv.SetOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Set with an ended context: %v", err)
	}
	reconnected(t, c)
	if n := srv.Requests(c.ID()) - sent; n != 1 {
		t.Fatalf("the store got %d requests; want only the marker", n)
	}
}

// TestWatchAcrossRestartWithClockBehind: the store restarts (every key and
// session lost), and the new store's clock is behind the old one's, so the
// versions it gives are lower than those the watcher knew. A SET made in the
// new store before the watcher is back must still be reported, not taken
// for older than what the watcher knew.
func TestWatchAcrossRestartWithClockBehind(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	addr := srv.Addr()
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p))
	ctx := testCtx(t)
	srv.SetClockOffset(time.Minute / 2) // the old store's versions are ahead
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	if _, err := c.Set(ctx, "k", []byte("old"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, w); string(ev.Value) != "old" {
		t.Fatalf("event %+v", ev)
	}
	p.Partition() // the watcher is away while the store restarts
	_ = srv.Close()
	next, err := localstore.Start(localstore.Config{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	set, err := dial(t, next).Set(ctx, "k", []byte("new"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Heal()
	if ev := nextEvent(t, w); !ev.Resync || string(ev.Value) != "new" || ev.Version != set.Version {
		t.Fatalf("event %+v after the restart, want Resync of the new store's SET at %v", ev, set.Version)
	}
}

// TestNoRepeatedResyncWhileForwarding is TestNoRepeatedResync with the race
// that test depends on pinned down: the watcher's forwarder still holds the
// Resync to v4, waiting for the reader, when the restore ends and v5 is set.
// A watcher already told v4 is owed nothing by the restore, so v5 comes as a
// plain SET once the reader reads again, not as a second Resync.
func TestNoRepeatedResyncWhileForwarding(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.WatchBuffer = 2 })
	other := dial(t, srv)
	ctx := testCtx(t)
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	set := func(v string) sskv.SetResult {
		t.Helper()
		r, err := other.Set(ctx, "k", []byte(v), sskv.SetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	learn := func(what string, r sskv.SetResult) {
		t.Helper()
		eventually(t, "the client to learn "+what, func() bool { v, _ := sskv.KnownForTest(c, "k"); return v == r.Version })
	}
	want := func(value string, resync bool) {
		t.Helper()
		if ev := nextEvent(t, w); ev.Resync != resync || string(ev.Value) != value {
			t.Fatalf("event %+v, want %s (Resync %v)", ev, value, resync)
		}
	}
	// Nobody reads: v1 waits in Events, the forwarder holds v2, v3 is
	// buffered, and v3b overflows: a Resync is owed.
	for _, v := range []string{"v1", "v2", "v3"} {
		set(v)
	}
	learn("v3b", set("v3b"))
	// Reconnect with slow answers; v4 is set while the watch is restored.
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{Delay: 400 * time.Millisecond})
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to be registered again", func() bool { return srv.Watching(c.ID(), "k") })
	learn("v4", set("v4"))
	// Reading v1 and v2 lets the forwarder take v3 and then the Resync
	// owed, to v4, which it holds: Events holds v3.
	want("v1", false)
	want("v2", false)
	eventually(t, "the restore to end", func() bool { _, resyncing := sskv.KnownForTest(c, "k"); return !resyncing })
	srv.SetResponseFault(c.ID(), localstore.ResponseFault{})
	learn("v5", set("v5"))
	want("v3", false)
	want("v4", true)
	want("v5", false) // the Resync to v4 was delivered already
}
