package leader_test

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// dialPatient connects a client that does not give up on a silent
// connection for 30 s, so that a Hold of its traffic does not make it
// reconnect (and resend) by itself.
func dialPatient(t *testing.T, addr, id string) *sskv.Client {
	t.Helper()
	c, err := sskv.Dial(testCtx(t), sskv.Config{
		Addr:         addr,
		ClientID:     id,
		KeepAlive:    30 * time.Second,
		PingTimeout:  30 * time.Second,
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

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
// leader/observe.go reports a token older than one it reported ended.
//
// Not fixed yet, so skipped: W still takes the key (its fenced SET is
// newer), and exclusion holds, but observers (and Leader) see the ended
// term again for a moment. A fix must keep Observe reporting the new
// leader after a store restart, whose tokens may be lower than the old
// ones; see the notes of the session that found it.
func TestObserveLateProclaim(t *testing.T) {
	if os.Getenv("DSSLOCK_KNOWN_BUGS") == "" {
		t.Skip("known: a late Proclaim can make Observe report an ended term again (set DSSLOCK_KNOWN_BUGS=1 to run)")
	}
	const ttl = 6 * time.Second
	srv, err := localstore.Start(localstore.Config{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	ctx := testCtx(t)
	admin := dial(t, srv.Addr())
	ch := dialPatient(t, srv.Addr(), "adv3-h")
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
	defer watch.Stop()
	time.Sleep(200 * time.Millisecond)

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
	for done := false; !done; {
		select {
		case ev := <-watch.Events():
			t.Logf("e: %v %q v%v", ev.Op, ev.Value, ev.Version)
		case <-drain:
			done = true
		}
	}
	_ = h.Resign(ctx)
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if g.s.ID == "h" && g.at.After(hEnded) {
			t.Errorf("Observe reported h leading (token %v, value %q) %v after h's term (token %v) ended; the next term is %v",
				g.s.Token, g.s.Value, g.at.Sub(hEnded), hToken, wr.term.Token())
		}
	}
}
