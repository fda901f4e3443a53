package lock_test

import (
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A FenceKey waiter whose client has just reconnected (the broker dropped
// its connection) is first in the queue when the holder releases: the
// release reserves the key for it. It takes the key at once. Before, it
// held off a TTL from its reconnect, as for a key that may have vanished
// with a store restart, and nobody could take the reserved key meanwhile:
// the lock sat idle. A key reserved for it has not vanished, and nobody
// else counts on it.
func TestReservedTurnTakenRightAfterReconnect(t *testing.T) {
	const ttl = 2 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "q", TTL: ttl, FenceKey: true}
	// The holder keeps a queue: it waited for the lock itself.
	holder := queueKeeper(t, srv, dial(t, srv.Addr()), cfg)

	wc := dial(t, srv.Addr())
	w := newLock(t, wc, cfg)
	got := queuedLock(t, dial(t, srv.Addr()), w)
	before, err := wc.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kick(wc.ID()); err != nil {
		t.Fatal(err)
	}
	// Back, with its inbox watched again.
	waitFor(t, "the waiter to reconnect", func() bool {
		cn, err := wc.Connection(ctx)
		return err == nil && cn != before && srv.Watching(wc.ID(), "q\x00inbox\x00"+w.HolderID())
	})
	start := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ttl / 2):
		t.Fatalf("the waiter had not taken the key reserved for it %v after the release (TTL %v)", time.Since(start), ttl)
	}
	t.Logf("taken %v after the release", time.Since(start).Round(time.Millisecond))
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// A FenceKey waiter is handed a key it never takes: its connection is
// frozen, and the reservation expires. A third Lock takes the key, and is
// cut off from the store; the key then vanishes (deleted by hand here, as a
// store restart would lose it) while that holder still counts on it. The
// waiter reconnects, and learns of its turn, with the version of the
// reservation that has expired. It must not take the key within its
// hold-off after the reconnect: the turn's version is no reservation it
// could take (only one it finds in the key would be), and its watch of the
// key found the key gone, unseen, after it had seen it held.
func TestExpiredReservationNotTakenAfterReconnect(t *testing.T) {
	const ttl = 2 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "q", TTL: ttl, FenceKey: true}
	admin := dial(t, srv.Addr())
	holder := queueKeeper(t, srv, dial(t, srv.Addr()), cfg)
	wc := dial(t, srv.Addr())
	w := newLock(t, wc, cfg)
	got := queuedLock(t, admin, w)

	// The waiter hears nothing more; the key is reserved for it, and
	// expires.
	if err := srv.Hold(wc.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	if err := holder.Unlock(ctx); err != nil {
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
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	select {
	case <-other.Done():
	default:
		t.Fatal("the waiter took the key while the Lock cut off still held it")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
