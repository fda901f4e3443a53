package lock_test

import (
	"context"
	"github.com/dsslock/dsslock/internal/storetest"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestSemaphoreStaleReservation: a participant that stops waiting while a
// slot is being reserved for it, and then tries the slots itself, never
// holds a slot at the same time as another participant.
//
// The sequence that broke it (K keeps slot 0's queue, Y holds slot 1, W
// waits, Z is fresh), when reservations were not fenced:
//  1. Y releases slot 1; K reserves it for W (SET NX of W's acquisition
//     record); K's answer is held back.
//  2. W's Acquire is cancelled (it leaves the queue; K does not see it
//     yet).
//  3. W calls TryAcquire: its SET NEX of that same record on slot 1
//     matched the reservation and applied (token T_W); its answers are
//     slow, so its fenced SET follows 1.5 s later.
//  4. K gets its answer and finds W gone: its VDEL of W's record deleted
//     slot 1, W's key, between W's two SETs.
//  5. Z's TryAcquire found slot 1 free: its SET NEX applied (T_Z > T_W).
//  6. W's fenced SET (T_W) applied over Z's unfenced record, and W's
//     TryAcquire returned true;
//  7. Z's fenced SET (T_Z) applied over W's record, and Z's returned true.
//
// A reservation is now fenced, so W's own attempt at step 3 is refused.
// A fresh participant tries the slots from a random one; with three of
// them, one tries slot 1 first 7 times in 8, which the old design failed.
func TestSemaphoreStaleReservation(t *testing.T) {
	const ttl = 6 * time.Second // renew deadline 4 s
	srv := startStore(t)
	admin := dial(t, srv.Addr())
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: ttl}
	part := func(id string) (*lock.Semaphore, *sskv.Client) {
		c := dial(t, srv.Addr())
		sc := cfg
		sc.HolderID = id
		return newSemaphore(t, c, sc), c
	}
	slot1 := lock.SemaphoreSlot("s", 1)
	ctx := testCtx(t)

	// K0 on slot 0 and Y on slot 1; K waits and gets slot 0 from K0, so
	// that it keeps the queue.
	k0, _ := part("k0")
	y, _ := part("y")
	k, ck := part("k")
	w, cw := part("w")
	// Three fresh participants try slot 1 in the gap: each tries the slots
	// from a random one, and one that tries slot 1 first (a 7 in 8 chance
	// that one does) hits the gap.
	var zs []*lock.Semaphore
	var czs []*sskv.Client
	for _, id := range []string{"z1", "z2", "z3"} {
		z, cz := part(id)
		zs, czs = append(zs, z), append(czs, cz)
	}
	wcancel, wDone := keeperRig(ctx, t, srv, admin, ck, k0, y, k, w)
	defer wcancel()

	watch, err := admin.Watch(ctx, slot1)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, watch)
	defer watch.Stop()
	next := func(what string, ok func(lock.Holder, sskv.Event) bool) lock.Holder {
		t.Helper()
		for {
			select {
			case ev := <-watch.Events():
				h := lock.ParseHolder(ev.Value, ev.Version)
				t.Logf("slot 1: %v %q v%v", ev.Op, ev.Value, ev.Version)
				if ok(h, ev) {
					return h
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s", what)
			}
		}
	}

	// 1. Y releases; K reserves slot 1 for W; K's answer is held back.
	srv.SetResponseFault(ck.ID(), localstore.ResponseFault{Delay: 200 * time.Millisecond})
	if err := y.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res := next("reservation", func(h lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpSet && h.ID == "w" })
	if err := srv.Hold(ck.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	// 2. W stops waiting.
	wcancel()
	if err := <-wDone; err == nil {
		t.Fatalf("w's Acquire succeeded (slot %d)", w.Slot())
	}
	// 3-7. W's TryAcquire, with slow answers: its SET on slot 1 applies
	// on top of the reservation (if the reservation lets it), or it gives
	// up; then the Zs try, and K gets its answer.
	raceForSlot(ctx, t, srv, watch, w, cw, zs, czs, 1500*time.Millisecond, 1000*time.Millisecond,
		func(h lock.Holder, ev sskv.Event) bool {
			return ev.Op == sskv.OpSet && h.ID == "w" && ev.Version.After(res.Version)
		}, func() {
			srv.SetResponseFault(ck.ID(), localstore.ResponseFault{})
			srv.Release(ck.ID())
		})
}

// keeperRig sets up participants of semaphore "s" (limit 2) so that k keeps
// slot 0's queue (it waited for slot 0, and k0 handed it over), y holds
// slot 1, and w waits in k's queue, with k watching slot 1 for it. It
// returns the cancel of w's Acquire, and where its result comes.
func keeperRig(ctx context.Context, t *testing.T, srv *localstore.Server, admin, ck *sskv.Client, k0, y, k, w *lock.Semaphore) (context.CancelFunc, <-chan error) {
	t.Helper()
	slot0, slot1 := lock.SemaphoreSlot("s", 0), lock.SemaphoreSlot("s", 1)
	// k0 must take slot 0, and y slot 1: each tries the slots from a
	// random one.
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
	// Time for k0 to confirm k's join (nothing outside the package shows
	// it), so that k0's release hands slot 0 and its queue to k.
	time.Sleep(100 * time.Millisecond)
	if err := k0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-kDone; err != nil || k.Slot() != 0 {
		t.Fatalf("k: %v, slot %d", err, k.Slot())
	}
	// w waits in k's queue; k watches slot 1 for it.
	wctx, wcancel := context.WithCancel(ctx)
	wDone := make(chan error, 1)
	go func() { wDone <- w.Acquire(wctx) }()
	waitFor(t, "k watching slot 1 for its waiter", func() bool { return srv.Watching(ck.ID(), slot1) })
	return wcancel, wDone
}

// raceForSlot ends the reservation tests: w tries the slots, its answers
// delayed by wDelay, and once its SET has reached slot 1 (wrote tells
// which event of watch, a watch of slot 1, that is) or it gave up, the
// fresh participants zs try too, their answers delayed by zDelay (czs are
// their clients), and heal lets the late message go. It fails t if w and
// one of zs both acquired one slot.
func raceForSlot(ctx context.Context, t *testing.T, srv *localstore.Server, watch *sskv.Watcher,
	w *lock.Semaphore, cw *sskv.Client, zs []*lock.Semaphore, czs []*sskv.Client,
	wDelay, zDelay time.Duration, wrote func(lock.Holder, sskv.Event) bool, heal func()) {
	t.Helper()
	srv.SetResponseFault(cw.ID(), localstore.ResponseFault{Delay: wDelay})
	for _, cz := range czs {
		srv.SetResponseFault(cz.ID(), localstore.ResponseFault{Delay: zDelay})
	}
	type result struct {
		s   *lock.Semaphore
		ok  bool
		err error
		at  time.Time
	}
	wRes, zRes := make(chan result, 1), make(chan result, len(zs))
	go func() {
		ok, err := w.TryAcquire(ctx)
		wRes <- result{w, ok, err, time.Now()}
	}()
	var wr result
	wReturned := false
	for waiting := true; waiting; {
		select {
		case ev := <-watch.Events():
			t.Logf("slot 1: %v %q v%v", ev.Op, ev.Value, ev.Version)
			waiting = !wrote(lock.ParseHolder(ev.Value, ev.Version), ev)
		case wr = <-wRes:
			wReturned, waiting = true, false
		case <-time.After(10 * time.Second):
			t.Fatal("w's TryAcquire neither wrote slot 1 nor returned")
		}
	}
	for _, z := range zs {
		go func() {
			ok, err := z.TryAcquire(ctx)
			zRes <- result{z, ok, err, time.Now()}
		}()
	}
	heal()
	if !wReturned {
		wr = <-wRes
	}
	zr := result{s: zs[0]}
	for range zs {
		if r := <-zRes; r.ok {
			zr = r
		}
	}
	z := zr.s
	wErr, zErr := w.Err(), z.Err() // once both have returned
	// The rest of slot 1's history, as the observer saw it.
	drain := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case ev := <-watch.Events():
			t.Logf("slot 1: %v %q v%v", ev.Op, ev.Value, ev.Version)
		case <-drain:
			done = true
		}
	}
	t.Logf("w: TryAcquire = %v, %v (slot %d, token %v); %s: TryAcquire = %v, %v (slot %d, token %v)",
		wr.ok, wr.err, w.Slot(), w.Token(), z.HolderID(), zr.ok, zr.err, z.Slot(), z.Token())
	if wr.ok && zr.ok && w.Slot() == z.Slot() {
		t.Errorf("w (token %v) and %s (token %v) both acquired slot %d, returning %v apart; once both had returned: w.Err = %v, %s.Err = %v",
			w.Token(), z.HolderID(), z.Token(), w.Slot(), wr.at.Sub(zr.at).Abs(), wErr, z.HolderID(), zErr)
	}
}
