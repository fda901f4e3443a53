package harness_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestHeldRenewalRecreatesDeletedKey forces the history seed 1008 failed on,
// with the real Elector and the real leader.Observe, and checks it as the
// harness does.
//
// A leader's traffic is held both ways; its key is deleted by hand; its
// next renewal, sent not knowing of the deletion (whose notification is
// held), reaches the store after it and re-creates the key; then its
// connection is dropped before anything held reaches the leader. The client resumes its session: the renewal's answer comes
// with it (the renewal succeeded, at the version it created), and the
// deletion's notification is folded into the Resync of the leader's watch,
// which shows the leader's own record. The leader confirms its key after
// the reconnect and finds it at the version of its last write: it cannot
// tell this renewal from any other, and goes on. Nobody held the key in
// between (a waiter that saw the deletion holds off; had anyone taken the
// key, the renewal's NEX would have failed). The lock package documents it.
//
// leader.Observe reports the deletion and not the re-created key (it does
// not report again a term it saw end), so the check must read the key to
// count this, rather than report "a term outlived its key".
//
// The history is forced unless the machine is too slow for it: if the
// leader's first renewal reached the store before its traffic was held, or
// never reached it (the hold came before the store answered an earlier
// request, and it stopped reading the connection), or the renewal's answer
// came after its renew deadline (the term then ends, and must be neither
// flagged nor counted), the test tries again.
func TestHeldRenewalRecreatesDeletedKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a store and an election")
	}
	const attempts = 5
	for i := 1; ; i++ {
		if heldRenewalRecreates(t) {
			return
		}
		if i == attempts {
			t.Fatalf("in %d attempts the history was never forced: the machine is too slow", attempts)
		}
	}
}

// The lease of the forced history: the schedules' renewed less often, so
// that the hold comes long before the first renewal (300 to 600 ms after
// the election), and with a longer renew deadline, within which the
// renewal's answer must come back through the resumed session.
const (
	recreateTTL      = 3 * ttl
	recreateInterval = 4 * renewInterval
	recreateDeadline = 1 * time.Second
)

// heldRenewalRecreates forces the history once, checks it, and reports
// whether it was forced (false: the test should try again).
func heldRenewalRecreates(t *testing.T) bool {
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
	s.h.lossGrace = recreateDeadline + 100*time.Millisecond
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	srv, addr := s.store(), s.store().Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const id = "recreate-leader"
	// The leader's connection goes through a proxy, which holds its
	// requests while the key is deleted: its renewal then reaches the
	// store after the deletion, whenever it was sent.
	proxy, err := faultproxy.Start(addr, faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: proxy.Addr(), ClientID: id,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s.admin, err = sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: "recreate-admin"}); err != nil {
		t.Fatal(err)
	}
	defer s.admin.Close()
	s.h.readKey = s.keyReader(ctx)

	// The observer, as in a schedule.
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	states, err := leader.Observe(octx, s.admin, election)
	if err != nil {
		t.Fatal(err)
	}
	observed := make(chan struct{})
	gone := make(chan struct{}) // closed once the observer saw the leader's key gone
	go func() {
		defer close(observed)
		led, tell := false, gone
		for st := range states {
			s.h.observed(st)
			switch {
			case st.HasLeader():
				led = true
			case led && tell != nil:
				close(tell)
				tell = nil
			}
		}
	}()
	// The administrator watches the key, to see the deletion and the
	// renewal that re-creates it.
	w, err := s.admin.Watch(ctx, election)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// The watch starts from the key's state: nobody leads yet.
	if ev := <-w.Events(); !ev.Initial || ev.Op != sskv.OpDelete {
		t.Fatalf("first event %+v; want Initial DELETE (no leader yet)", ev)
	}

	e, err := leader.NewElector(c, election, []byte(id), leader.WithCandidateID(id),
		leader.WithTTL(recreateTTL), leader.WithRenewInterval(recreateInterval), leader.WithRenewDeadline(recreateDeadline))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	leading := make(chan *leader.Term, 1)
	var lost error
	ran := make(chan error, 1)
	defer func() {
		stop()
		<-ran // Run has returned, whatever became of the attempt
	}()
	go func() {
		ran <- e.Run(runCtx, func(ctx context.Context, term *leader.Term) error {
			rec := s.h.termStarted(0, id, term.Token(), func() bool {
				_, err := term.FencingToken()
				return err == nil
			})
			defer s.h.termEnded(rec)
			leading <- term
			<-ctx.Done()
			if runCtx.Err() == nil {
				lost = term.Err() // read after Run returns
			}
			return nil
		})
	}()
	var term *leader.Term
	select {
	case term = <-leading:
	case <-ctx.Done():
		t.Fatal("not elected")
	}

	// Hold the leader's traffic, both ways, and delete its key. The store
	// holds what it sends the leader, the proxy what the leader sends.
	held := s.h.now()
	if err := srv.Hold(id, localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	g, err := s.admin.Get(ctx, election)
	if err != nil {
		t.Fatal(err)
	}
	holder := lock.ParseHolder(g.Value, g.Version)
	if holder.Token != term.Token() {
		t.Fatalf("the key holds %+v, want the term's token %v", holder, term.Token())
	}
	s.h.fault(s.h.now(), 0, s.deleteKey(ctx, election, holder))
	proxy.Heal()
	// The leader's next renewal re-creates the key: seen by the
	// administrator's watch as the deletion, then the leader's record.
	deleted, writes := false, 0 // writes: the term's records seen before the deletion
	for recreated := false; !recreated; {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("the administrator's watch ended: %v", w.Err())
			}
			h := lock.ParseHolder(ev.Value, ev.Version)
			own := ev.Op == sskv.OpSet && h.ID == id && h.Token == term.Token()
			switch {
			case ev.Op == sskv.OpDelete:
				deleted = true
			case !deleted && own:
				writes++ // the acquisition's fenced SET, or a renewal
			case !deleted: // the acquisition's first SET
			case own:
				recreated = true
			default:
				// The term ended before its renewal reached the store: the
				// hold began before the store had answered a request of
				// the leader's (the guard's KEYNOTIFY, say), and a store
				// whose answer is held reads nothing more from the
				// connection. The leader campaigns again.
				t.Logf("after the deletion the key holds %+v, not the term's renewal; trying again", h)
				return false
			}
		case <-ctx.Done():
			t.Fatal("the leader's renewal did not re-create its key")
		}
	}
	if writes > 1 {
		t.Logf("the leader's first renewal reached the store before its traffic was held; trying again")
		return false
	}
	// Drop the connection: nothing held reaches the leader on it.
	if err := srv.Drop(id); err != nil {
		t.Fatal(err)
	}
	s.h.delayed(id, held, s.h.now())

	// The check of the term is due its renew deadline (and 100 ms) after
	// the observer saw the key gone; the term leads until it is made, or
	// ends.
	select {
	case <-gone:
	case <-ctx.Done():
		t.Fatal("the observer did not see the key deleted")
	}
	v, late := s.h.checkObserver()
	stop()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	ran <- nil // for the deferred wait
	stopObserving()
	<-observed
	t.Logf("the term ended %v; checks: violations %q, counted %q", lost, v, late)
	if len(v) > 0 {
		t.Errorf("violations %q: a key re-created by its own held renewal, nobody between, is counted", v)
	}
	switch {
	case lost == nil && len(late) != 1:
		t.Errorf("the term went on with its re-created key, and was counted %d times, want once: %q", len(late), late)
	case lost != nil && len(late) != 0:
		t.Errorf("the term ended (%v), yet was counted: %q", lost, late)
	case lost != nil:
		t.Logf("the renewal's answer came after the renew deadline; trying again")
		return false
	}
	return true
}
