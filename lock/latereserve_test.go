package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestSemaphoreLateReserveGiveBack: a keeper whose first waiter left while
// it reserved a slot for it no longer deletes the reservation itself: that
// VDEL, fenced with the keeper's token of slot 0, could reach the store
// late, after the reservation expired, while the waiter took the same slot
// by itself (TryAcquire) with the very record the reservation held. The
// key created by the waiter's SET NEX has no token yet, so the VDEL was
// accepted and deleted the slot between the waiter's two SETs, and a third
// participant took it too: two holders of one slot. The keeper now tells
// the waiter, whose decline deletes the reservation with its slot Lock's
// turn, in order with its own acquisitions.
//
// The sequence that broke it (K keeps slot 0's queue, Y holds slot 1, W
// waits, Z1..Z3 are fresh; limit 2, TTL 6 s):
//  1. K's answers are delayed 1.5 s. Y releases slot 1; K reserves it for
//     W (fenced SET NX of W's record with K's slot-0 token T_K).
//  2. W's Acquire is cancelled at once: its leave reaches K before the
//     SET's answer. K's request traffic is held (1.1 s after the
//     reservation). The answer comes; W is no longer K's (served false),
//     so K sends the give-back: VDEL of W's record fenced with T_K, held.
//  3. The reservation expires (TTL); K's slot 0 expires too (its renewals
//     are held); another holder takes slot 0 (a fenced SET NX of the
//     admin), so that slot 1 is the only free slot.
//  4. W calls TryAcquire with slow answers (1.2 s): its SET NEX creates
//     slot 1 with W's record, without a token.
//  5. K's path heals: its VDEL fenced with T_K is accepted on the
//     token-less key, and deletes slot 1 between W's two SETs.
//  6. Z's TryAcquire (answers 0.8 s) finds slot 1 free: its SET NEX applies.
//  7. W's fenced SET (T_W) applies over Z's token-less record; W's
//     TryAcquire returns true.
//  8. Z's fenced SET (T_Z > T_W) applies over W's record; Z's returns true.
//
// (A fresh participant tries the slots from a random one; with three, one
// tries slot 0 first, and so slot 1 late enough, 7 times in 8.)
func TestSemaphoreLateReserveGiveBack(t *testing.T) {
	const ttl = 6 * time.Second // renew deadline 4 s
	srv, err := localstore.Start(localstore.Config{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin := dial(t, srv.Addr())
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: ttl, RenewInterval: 500 * time.Millisecond}
	part := func(id string, c *sskv.Client) *lock.Semaphore {
		sc := cfg
		sc.HolderID = id
		return newSemaphore(t, c, sc)
	}
	slot0, slot1 := lock.SemaphoreSlot("s", 0), lock.SemaphoreSlot("s", 1)
	ctx := testCtx(t)

	k0 := part("k0", dial(t, srv.Addr()))
	y := part("y", dial(t, srv.Addr()))
	ck := storetest.DialPatient(t, srv.Addr(), "")
	k := part("k", ck)
	cw := dial(t, srv.Addr())
	w := part("w", cw)
	var zs []*lock.Semaphore
	var czs []*sskv.Client
	for _, id := range []string{"z1", "z2", "z3"} {
		cz := dial(t, srv.Addr())
		zs, czs = append(zs, part(id, cz)), append(czs, cz)
	}
	if _, err := admin.Set(ctx, slot1, []byte("dummy"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k0.Acquire(ctx); err != nil || k0.Slot() != 0 {
		t.Fatalf("k0: %v, slot %d", err, k0.Slot())
	}
	if _, err := admin.Del(ctx, slot1, sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := y.Acquire(ctx); err != nil || y.Slot() != 1 {
		t.Fatalf("y: %v, slot %d", err, y.Slot())
	}
	kDone := make(chan error, 1)
	go func() { kDone <- k.Acquire(ctx) }()
	waitFor(t, "k waiting", func() bool { return srv.Watching(ck.ID(), slot0) })
	time.Sleep(100 * time.Millisecond)
	if err := k0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-kDone; err != nil || k.Slot() != 0 {
		t.Fatalf("k: %v, slot %d", err, k.Slot())
	}

	// W waits in K's queue; K watches slot 1 for it.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wDone := make(chan error, 1)
	go func() { wDone <- w.Acquire(wctx) }()
	waitFor(t, "k watching slot 1 for its waiter", func() bool { return srv.Watching(ck.ID(), slot1) })

	watch, err := admin.Watch(ctx, slot1)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, watch)
	defer watch.Stop()
	next := func(what string, within time.Duration, ok func(lock.Holder, sskv.Event) bool) lock.Holder {
		t.Helper()
		for {
			select {
			case ev := <-watch.Events():
				h := lock.ParseHolder(ev.Value, ev.Version)
				t.Logf("slot 1: %v %q v%v", ev.Op, ev.Value, ev.Version)
				if ok(h, ev) {
					return h
				}
			case <-time.After(within):
				t.Fatalf("no %s", what)
			}
		}
	}

	// 1. Y releases; K reserves slot 1 for W, and its answer is slow.
	srv.SetResponseFault(ck.ID(), localstore.ResponseFault{Delay: 1500 * time.Millisecond})
	if err := y.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next("reservation", 5*time.Second, func(h lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpSet && h.ID == "w" })
	r0 := time.Now()
	// 2. W stops waiting at once: its leave reaches K before the answer.
	wcancel()
	if err := <-wDone; err == nil {
		t.Fatalf("w's Acquire succeeded (slot %d)", w.Slot())
	}
	t.Logf("w's Acquire cancelled %v after the reservation", time.Since(r0))
	// K's path to the store freezes before the answer comes: its give-back
	// VDEL (fenced with K's token of slot 0) is not executed yet.
	time.Sleep(1100*time.Millisecond - time.Since(r0))
	if err := srv.Hold(ck.ID(), localstore.ToStore); err != nil {
		t.Fatal(err)
	}

	// 3. The reservation expires; slot 0 goes to another holder.
	next("expiry of the reservation", 2*ttl, func(h lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpDelete })
	for {
		res, err := admin.Set(ctx, slot0, []byte("other"), sskv.SetOptions{Condition: sskv.IfNotExists, FencingToken: srv.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if res.Applied {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	// 4-8. W's TryAcquire, with slow answers; once its SET NEX reached slot 1,
	// the Zs try, and K's path heals.
	raceForSlot(ctx, t, srv, watch, w, cw, zs, czs, 1200*time.Millisecond, 800*time.Millisecond,
		func(h lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpSet && h.ID == "w" }, func() {
			srv.SetResponseFault(ck.ID(), localstore.ResponseFault{})
			srv.Release(ck.ID())
		})
}
