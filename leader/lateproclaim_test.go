package leader_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestObserveLateProclaim: a Proclaim of a term that has ended, reaching the
// store late (its path froze), lands between the two SETs of the next
// candidate's acquisition: its SET is fenced with the old term's token and
// unconditional (a rewrite), and the key created by the candidate's SET
// NEX has no token, so the store takes it. Observe then reports the old
// leader, with its old token and the proclaimed value, as leading again,
// after it reported nobody leading and after the old Term ended (Done,
// Err lost): a term that is over comes back, and the tokens observers see
// go back.
//
// The sequence (TTL 6 s):
//  1. H leads (term token T_H). An observer watches.
//  2. H's request traffic is held; H proclaims "h2": a SET of H's record
//     with "h2", fenced with T_H, without a condition (holding.write with
//     rewrite), held. Its renewals wait behind it (writeMu).
//  3. H's term is lost at its renew deadline; the key expires; the observer
//     reports nobody leading.
//  4. W campaigns with slow answers (1.2 s): its SET NEX creates the key
//     with W's acquisition record, without a token.
//  5. H's path heals: the Proclaim's SET, fenced with T_H, is accepted on
//     the token-less key: the key holds H's record, token T_H, "h2".
//     The observer reports H leading (T_H, "h2").
//  6. W's fenced SET (T_W) applies; the observer reports W.
//
// Code at fault: lock/holding.go write: a rewrite (SetValue) is an
// unconditional fenced SET, which a key without a token accepts; and
// leader/observe.go reported a token of a term it had reported ended.
//
// Fixed in Observe, which remembers the tokens of the last terms it saw
// end and does not report them again. W still takes the key (its fenced
// SET is newer), so exclusion never depended on it. Leader, a single GET,
// can still return the ended term while the late write is on the key; its
// doc says so.
func TestObserveLateProclaim(t *testing.T) {
	const ttl = 6 * time.Second
	srv, err := localstore.Start(localstore.Config{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx := testCtx(t)
	admin := dial(t, srv.Addr())
	ch := storetest.DialPatient(t, srv.Addr(), "adv3-h")
	cw := dial(t, srv.Addr())
	co := dial(t, srv.Addr())

	h, err := leader.Campaign(ctx, ch, "e", []byte("h"), leader.WithTTL(ttl), leader.WithCandidateID("h"))
	if err != nil {
		t.Fatal(err)
	}
	hToken := h.Token()
	states, err := leader.Observe(ctx, co, "e")
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		s  leader.State
		at time.Time
	}
	var mu sync.Mutex
	var got []seen
	select {
	case s := <-states:
		got = append(got, seen{s, time.Now()})
	case <-ctx.Done():
		t.Fatal("no first state from Observe")
	}
	go func() {
		for s := range states {
			mu.Lock()
			got = append(got, seen{s, time.Now()})
			mu.Unlock()
			t.Logf("observe: %q %q %v resync=%v", s.ID, s.Value, s.Token, s.Resync)
		}
	}()
	watch, err := admin.Watch(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, watch)
	defer watch.Stop()

	// 2.
	if err := srv.Hold(ch.ID(), localstore.ToStore); err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.Proclaim(ctx, []byte("h2")) }()
	// 3.
	select {
	case <-h.Done():
	case <-time.After(2 * ttl):
		t.Fatal("h's term not lost")
	}
	hEnded := time.Now()
	t.Logf("h's term ended: %v", h.Err())
	for {
		select {
		case ev := <-watch.Events():
			t.Logf("e: %v %q v%v", ev.Op, ev.Value, ev.Version)
			if ev.Op == sskv.OpDelete {
				goto expired
			}
		case <-time.After(2 * ttl):
			t.Fatal("key did not expire")
		}
	}
expired:
	// 4.
	srv.SetResponseFault(cw.ID(), localstore.ResponseFault{Delay: 1200 * time.Millisecond})
	type res struct {
		term *leader.Term
		err  error
	}
	wDone := make(chan res, 1)
	go func() {
		term, err := leader.Campaign(ctx, cw, "e", []byte("w"), leader.WithTTL(ttl), leader.WithCandidateID("w"))
		wDone <- res{term, err}
	}()
	for {
		select {
		case ev := <-watch.Events():
			t.Logf("e: %v %q v%v", ev.Op, ev.Value, ev.Version)
			if ev.Op == sskv.OpSet && bytes.HasPrefix(ev.Value, []byte("w\n")) {
				goto taken
			}
		case <-time.After(2 * ttl):
			t.Fatal("w did not take the key")
		}
	}
taken:
	// 5.
	srv.Release(ch.ID())
	wr := <-wDone
	if wr.err != nil {
		t.Fatalf("w's campaign: %v", wr.err)
	}
	t.Cleanup(func() { _ = wr.term.Resign(ctx) })
	drain := time.After(500 * time.Millisecond)
	landed := false // the late Proclaim reached the key
	for done := false; !done; {
		select {
		case ev := <-watch.Events():
			t.Logf("e: %v %q v%v", ev.Op, ev.Value, ev.Version)
			landed = landed || (ev.Op == sskv.OpSet && bytes.HasSuffix(ev.Value, []byte("h2")))
		case <-drain:
			done = true
		}
	}
	_ = h.Resign(ctx)
	if !landed {
		t.Log("the late Proclaim did not land between w's two SETs this time; nothing to check")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if g.s.ID == "h" && g.at.After(hEnded) {
			t.Errorf("Observe reported h leading (token %v, value %q) %v after h's term (token %v) ended; the next term is %v",
				g.s.Token, g.s.Value, g.at.Sub(hEnded), hToken, wr.term.Token())
		}
	}
}
