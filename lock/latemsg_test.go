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

// TestLockLateTurnHandOn: a turn (msgTurn) with a reservation that
// reaches a Lock after it stopped waiting, and after the reservation
// expired, while that Lock takes the key by itself (TryLock), must not make
// it delete the key between the two SETs of its own acquisition.
//
// handOn (package wait) frees a reservation for a Lock that no longer waits
// with a VDEL of the Lock's acquisition record fenced with the
// reservation's version, in the background. It now does so with the
// Lock's turn, after the TryLock below; before, it did not, and so: the
// Lock's own TryLock writes that very record with its SET NEX into a key
// that (created by it) has no token, so the late VDEL is accepted and
// deletes the key inside the acquisition's two-SET window; the next waiter
// takes it; both acquisitions complete.
//
// The sequence that broke it (FenceKey, TTL 6 s; H holds, and keeps the queue (it was
// handed the lock by H0); L, M1, M2 wait in that order):
//  1. L's inbound traffic is held (it must not take the reservation by
//     itself). H releases: its fenced SET writes L's record (the
//     reservation, version R); then H's request traffic is held, so its
//     msgTurn to L is not executed yet.
//  2. L's Lock is cancelled (it leaves); L's traffic is released. Its queue
//     lingers a TTL.
//  3. M1 and M2 (the key's watchers) are held inbound, so that they do not
//     take the key when the reservation expires.
//  4. The reservation expires. L calls TryLock with slow answers (1.2 s):
//     its SET NEX creates the key with L's record, without a token.
//  5. H's path heals: its msgTurn (reservation R) reaches L, which does not
//     wait: handOn's VDEL of L's record fenced with R is accepted on the
//     token-less key, and deletes it, between L's two SETs.
//  6. M1 and M2 are released (answers 1.5 s): M1, the first waiter, sees the
//     key free and takes it: its SET NEX applies.
//  7. L's fenced SET (T_L) applies over M1's token-less record; L's TryLock
//     returns true.
//  8. M1's fenced SET (T_M1 > T_L) applies over L's record; M1's Lock
//     returns nil.
func TestLockLateTurnHandOn(t *testing.T) {
	const ttl = 6 * time.Second
	srv, err := localstore.Start(localstore.Config{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin := dial(t, srv.Addr())
	ctx := testCtx(t)
	mk := func(id string, c *sskv.Client) *lock.Lock {
		return newLock(t, c, lock.Config{Name: "x", HolderID: id, TTL: ttl, FenceKey: true})
	}
	ch, cl, cm1, cm2 := storetest.DialPatient(t, srv.Addr(), ""), dial(t, srv.Addr()), storetest.DialPatient(t, srv.Addr(), ""), storetest.DialPatient(t, srv.Addr(), "")
	h, l, m1, m2 := mk("h", ch), mk("l", cl), mk("m1", cm1), mk("m2", cm2)
	// H takes the lock from H0 by its turn, so that it keeps the queue.
	h0 := mk("h0", dial(t, srv.Addr()))
	if err := h0.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hDone := make(chan error, 1)
	go func() { hDone <- h.Lock(ctx) }()
	time.Sleep(300 * time.Millisecond)
	if err := h0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-hDone; err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	lDone := make(chan error, 1)
	go func() { lDone <- l.Lock(lctx) }()
	time.Sleep(300 * time.Millisecond)
	type res struct {
		l   *lock.Lock
		err error
		at  time.Time
	}
	mDone := make(chan res, 2)
	for _, m := range []*lock.Lock{m1, m2} {
		go func() {
			err := m.Lock(ctx)
			mDone <- res{m, err, time.Now()}
		}()
		time.Sleep(300 * time.Millisecond)
	}

	watch, err := admin.Watch(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, watch)
	defer watch.Stop()
	next := func(what string, within time.Duration, ok func(lock.Holder, sskv.Event) bool) {
		t.Helper()
		for {
			select {
			case ev := <-watch.Events():
				hd := lock.ParseHolder(ev.Value, ev.Version)
				t.Logf("x: %v %q v%v", ev.Op, ev.Value, ev.Version)
				if ok(hd, ev) {
					return
				}
			case <-time.After(within):
				t.Fatalf("no %s", what)
			}
		}
	}

	// 1.
	if err := srv.Hold(cl.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	srv.SetResponseFault(ch.ID(), localstore.ResponseFault{Delay: 200 * time.Millisecond})
	go func() { _ = h.Unlock(ctx) }()
	next("reservation", 5*time.Second, func(hd lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpSet && hd.ID == "l" })
	if err := srv.Hold(ch.ID(), localstore.ToStore); err != nil {
		t.Fatal(err)
	}
	r0 := time.Now()
	// 2.
	time.Sleep(300 * time.Millisecond)
	lcancel()
	if err := <-lDone; err == nil {
		t.Fatal("l's Lock succeeded")
	}
	srv.Release(cl.ID())
	time.Sleep(200 * time.Millisecond)
	// 3.
	for _, c := range []*sskv.Client{cm1, cm2} {
		if err := srv.Hold(c.ID(), localstore.FromStore); err != nil {
			t.Fatal(err)
		}
	}
	// 4.
	next("expiry of the reservation", 2*ttl, func(_ lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpDelete })
	t.Logf("reservation expired %v after it was written", time.Since(r0))
	srv.SetResponseFault(cl.ID(), localstore.ResponseFault{Delay: 1200 * time.Millisecond})
	for _, c := range []*sskv.Client{cm1, cm2} {
		srv.SetResponseFault(c.ID(), localstore.ResponseFault{Delay: 1500 * time.Millisecond})
	}
	lRes := make(chan res, 1)
	var lOK bool
	go func() {
		ok, err := l.TryLock(ctx)
		lOK = ok
		lRes <- res{l, err, time.Now()}
	}()
	next("l's SET NEX", 5*time.Second, func(hd lock.Holder, ev sskv.Event) bool { return ev.Op == sskv.OpSet && hd.ID == "l" })
	// 5.
	srv.SetResponseFault(ch.ID(), localstore.ResponseFault{})
	srv.Release(ch.ID())
	deleted := false
	select {
	case ev := <-watch.Events():
		t.Logf("x: %v %q v%v", ev.Op, ev.Value, ev.Version)
		deleted = ev.Op == sskv.OpDelete
	case <-time.After(time.Second):
	}
	t.Logf("l's key deleted between its two SETs: %v", deleted)
	// 6.
	srv.Release(cm1.ID())
	srv.Release(cm2.ID())
	lr := <-lRes
	var mr res
	select {
	case mr = <-mDone:
	case <-time.After(4 * time.Second):
	}
	lErr := l.Err()
	var mErr error = lock.ErrNotHeld
	if mr.l != nil {
		mErr = mr.l.Err()
	}
	drain := time.After(200 * time.Millisecond)
	for done := false; !done; {
		select {
		case ev, ok := <-watch.Events():
			if !ok {
				done = true
				break
			}
			t.Logf("x: %v %q v%v", ev.Op, ev.Value, ev.Version)
		case <-drain:
			done = true
		}
	}
	t.Logf("l: TryLock = %v, %v (token %v); m: %v (token %v)", lOK, lr.err, l.Token(), mr.err, func() any {
		if mr.l == nil {
			return nil
		}
		return mr.l.Token()
	}())
	if lOK && mr.l != nil && mr.err == nil {
		t.Errorf("l (token %v) and %s (token %v) both acquired x, returning %v apart; once both had returned: l.Err = %v, %s.Err = %v",
			l.Token(), mr.l.HolderID(), mr.l.Token(), lr.at.Sub(mr.at).Abs(), lErr, mr.l.HolderID(), mErr)
	}
}
