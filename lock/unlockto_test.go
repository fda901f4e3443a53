package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// acquireAsync runs lock.Acquire of cfg on c in the background, and
// returns once its wait watches the key of the lock, held by another.
func acquireAsync(t *testing.T, srv interface{ Watching(string, string) bool }, c *sskv.Client, cfg lock.Config) <-chan *lock.Lock {
	t.Helper()
	got := make(chan *lock.Lock, 1)
	go func() {
		l, err := lock.Acquire(testCtx(t), c, cfg)
		if err != nil {
			t.Errorf("Acquire as %s: %v", cfg.HolderID, err)
		}
		got <- l
	}()
	waitFor(t, cfg.HolderID+" to wait", func() bool { return srv.Watching(c.ID(), cfg.Name) })
	return got
}

// UnlockTo hands the key to the named waiter at once (the TTL is a
// minute: not by expiry), with a newer token, while another waiter does
// not get it: the key holds only the old holder's record, the
// reservation, and the named waiter's records, in that order.
func TestUnlockToHandsOverToNamedWaiter(t *testing.T) {
	srv := startStore(t)
	cfg := lock.Config{Name: "l", TTL: time.Minute, FenceKey: true, Race: true}
	as := cfg
	as.HolderID = "a"
	a := newLock(t, dial(t, srv.Addr()), as)
	mustLock(t, a)

	ctx := testCtx(t)
	obs := dial(t, srv.Addr())
	w, err := obs.Watch(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	storetest.SkipInitial(t, w)

	bs, cs := cfg, cfg
	bs.HolderID, cs.HolderID = "b", "c"
	gotC := acquireAsync(t, srv, dial(t, srv.Addr()), cs)
	gotB := acquireAsync(t, srv, dial(t, srv.Addr()), bs)

	start := time.Now()
	if err := a.UnlockTo(ctx, "b"); err != nil {
		t.Fatalf("UnlockTo: %v", err)
	}
	if !errors.Is(a.Err(), lock.ErrReleased) {
		t.Fatalf("a.Err after UnlockTo = %v; want ErrReleased", a.Err())
	}
	var b *lock.Lock
	select {
	case b = <-gotB:
	case c := <-gotC:
		t.Fatalf("c took the key handed to b (c holds %v)", c != nil)
	case <-time.After(waitTimeout):
		t.Fatal("b did not take the key handed to it")
	}
	if b == nil {
		t.FailNow()
	}
	t.Logf("b took the key %v after UnlockTo", time.Since(start))
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
	t.Cleanup(func() { _ = b.Close(ctx) })

	// Every change of the key from the handover to b's holding.
	for {
		ev := <-w.Events()
		if ev.Op != sskv.OpSet {
			t.Fatalf("the key was deleted during the handover: %+v", ev)
		}
		h := lock.ParseHolder(ev.Value, ev.Version)
		if h.ID != "a" && h.ID != "b" {
			t.Fatalf("the key held %q during the handover", ev.Value)
		}
		if h.ID == "b" && h.Token == b.Token() {
			break
		}
	}
	select {
	case <-gotC:
		t.Fatal("c acquired while b holds")
	default:
	}

	// c goes on waiting, and takes the key once b releases it.
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-gotC:
		if c == nil {
			t.FailNow()
		}
		if !c.Token().After(b.Token()) {
			t.Errorf("c's token %v is not after b's %v", c.Token(), b.Token())
		}
		_ = c.Close(ctx)
	case <-time.After(waitTimeout):
		t.Fatal("c did not take the key b released")
	}
}

// A Lock's own racing wait (Lock.Lock with Race) takes a key handed to it
// too.
func TestUnlockToLockWaiter(t *testing.T) {
	srv := startStore(t)
	cfg := lock.Config{Name: "l", TTL: time.Minute, FenceKey: true, Race: true}
	as, bs := cfg, cfg
	as.HolderID, bs.HolderID = "a", "b"
	a := newLock(t, dial(t, srv.Addr()), as)
	mustLock(t, a)
	cb := dial(t, srv.Addr())
	b := newLock(t, cb, bs)
	got := make(chan error, 1)
	go func() { got <- b.Lock(testCtx(t)) }()
	waitFor(t, "b to wait", func() bool { return srv.Watching(cb.ID(), "l") })
	if err := a.UnlockTo(testCtx(t), "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("b did not take the key handed to it")
	}
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
}

// Handed to an id nobody waits as, the key is reserved until it expires,
// and then the waiters race for it as usual.
func TestUnlockToAbsentFallsBackAfterTTL(t *testing.T) {
	srv := startStore(t)
	const ttl = 500 * time.Millisecond
	cfg := lock.Config{Name: "l", TTL: ttl, FenceKey: true, Race: true}
	as, cs := cfg, cfg
	as.HolderID, cs.HolderID = "a", "c"
	a := newLock(t, dial(t, srv.Addr()), as)
	mustLock(t, a)
	gotC := acquireAsync(t, srv, dial(t, srv.Addr()), cs)

	start := time.Now()
	if err := a.UnlockTo(testCtx(t), "gone"); err != nil {
		t.Fatalf("UnlockTo: %v", err)
	}
	if h := holder(t, a); h.ID != "gone" || !h.Token.IsZero() {
		t.Fatalf("Holder after UnlockTo = %+v; want a reservation for gone", h)
	}
	select {
	case c := <-gotC:
		if c == nil {
			t.FailNow()
		}
		defer func() { _ = c.Close(testCtx(t)) }()
		if d := time.Since(start); d < ttl/2 {
			t.Fatalf("c took the key %v after it was handed to another; want after the reservation expired", d)
		}
		if !c.Token().After(a.Token()) {
			t.Errorf("c's token %v is not after a's %v", c.Token(), a.Token())
		}
	case <-time.After(waitTimeout):
		t.Fatal("nobody took the key after the reservation expired")
	}
}

func TestUnlockToConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, cfg := range []lock.Config{
		{Name: "plain", Race: true},
		{Name: "queued", FenceKey: true},
	} {
		l := newLock(t, c, cfg)
		mustLock(t, l)
		if err := l.UnlockTo(testCtx(t), "x"); !errors.Is(err, lock.ErrConfig) {
			t.Errorf("UnlockTo on %+v = %v; want ErrConfig", cfg, err)
		}
	}
	l := newLock(t, c, lock.Config{Name: "l", FenceKey: true, Race: true})
	if err := l.UnlockTo(testCtx(t), "x"); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("UnlockTo before Lock = %v; want ErrNotHeld", err)
	}
	mustLock(t, l)
	for _, id := range []string{"", "a\nb"} {
		if err := l.UnlockTo(testCtx(t), id); !errors.Is(err, lock.ErrConfig) {
			t.Errorf("UnlockTo(%q) = %v; want ErrConfig", id, err)
		}
	}
}

// A waiter whose client has just reconnected takes a key handed to it at
// once, not after its hold-off (a TTL from the reconnect): a key that holds
// its reservation has not vanished, and nobody else counts on it.
func TestUnlockToTakenRightAfterReconnect(t *testing.T) {
	const ttl = 2 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "q", TTL: ttl, FenceKey: true, Race: true}
	as, bs := cfg, cfg
	as.HolderID, bs.HolderID = "a", "b"
	a := newLock(t, dial(t, srv.Addr()), as)
	mustLock(t, a)
	wc := dial(t, srv.Addr())
	got := acquireAsync(t, srv, wc, bs)
	before, err := wc.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kick(wc.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter to reconnect", func() bool {
		cn, err := wc.Connection(ctx)
		return err == nil && cn != before && srv.Watching(wc.ID(), "q")
	})
	start := time.Now()
	if err := a.UnlockTo(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b == nil {
			t.FailNow()
		}
		t.Logf("taken %v after UnlockTo", time.Since(start).Round(time.Millisecond))
		_ = b.Close(ctx)
	case <-time.After(ttl / 2):
		t.Fatalf("the waiter had not taken the key handed to it %v after UnlockTo (TTL %v)", time.Since(start), ttl)
	}
}

// A waiter cut off from the store's messages while the key is handed to
// it misses the reservation; it expires, another Lock takes the key and is
// cut off, and the key vanishes (deleted by hand, as a store restart would
// lose it) while that Lock still counts on it. The waiter reconnects: it
// must not take the key within its hold-off. (The store drops what it held
// back, so the waiter never hears of the reservation here: this guards the
// hold-off of a waiter that was handed the key, not the read that confirms
// a reservation it heard of, which TestUnlockToTakenRightAfterReconnect
// covers from the other side.)
func TestUnlockToExpiredNotTakenAfterReconnect(t *testing.T) {
	const ttl = 2 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "q", TTL: ttl, FenceKey: true, Race: true}
	as, bs := cfg, cfg
	as.HolderID, bs.HolderID = "a", "b"
	admin := dial(t, srv.Addr())
	a := newLock(t, dial(t, srv.Addr()), as)
	mustLock(t, a)
	wc := dial(t, srv.Addr())
	got := acquireAsync(t, srv, wc, bs)

	// The waiter hears nothing more; the key is handed to it, and the
	// reservation expires.
	if err := srv.Hold(wc.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	if err := a.UnlockTo(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reservation to expire", func() bool {
		res, err := admin.Get(ctx, "q")
		return err == nil && !res.Found
	})
	// Another takes it, and is cut off.
	proxy := startProxy(t, srv.Addr())
	other := newLock(t, dial(t, proxy.Addr()), cfg)
	if ok, err := other.TryLock(ctx); !ok || err != nil {
		t.Fatalf("TryLock = %v, %v", ok, err)
	}
	proxy.Partition()
	if _, err := admin.Del(ctx, "q", sskv.DelOptions{FencingToken: other.Token()}); err != nil {
		t.Fatal(err)
	}
	// The waiter comes back.
	if err := srv.Kick(wc.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if b == nil {
			t.FailNow()
		}
		defer func() { _ = b.Close(ctx) }()
	case <-time.After(waitTimeout):
		t.Fatal("the waiter never took the key")
	}
	select {
	case <-other.Done():
	default:
		t.Fatal("the waiter took the key while the Lock cut off still held it")
	}
}
