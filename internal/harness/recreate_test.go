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
func TestHeldRenewalRecreatesDeletedKey(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a store and an election")
	}
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
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

	// The schedules' lease, renewed less often: the first renewal comes
	// 150 to 300 ms after the election, long after the hold below began.
	e, err := leader.NewElector(c, election, []byte(id), leader.WithCandidateID(id),
		leader.WithTTL(ttl), leader.WithRenewInterval(2*renewInterval), leader.WithRenewDeadline(renewDeadline))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	leading := make(chan *leader.Term, 1)
	var lost error
	ran := make(chan error, 1)
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
	s.h.fault(s.h.now(), 0, s.deleteKey(ctx, holder))
	proxy.Heal()
	// The leader's next renewal re-creates the key: seen by the
	// administrator's watch as the deletion, then the leader's record.
	deleted := false
	for recreated := false; !recreated; {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("the administrator's watch ended: %v", w.Err())
			}
			h := lock.ParseHolder(ev.Value, ev.Version)
			switch {
			case ev.Op == sskv.OpDelete:
				deleted = true
			case deleted && h.ID == id && h.Token == term.Token():
				recreated = true
			case deleted:
				t.Fatalf("after the deletion the key holds %+v, want the leader's record", h)
			}
		case <-ctx.Done():
			t.Fatal("the leader's renewal did not re-create its key")
		}
	}
	// Drop the connection: nothing held reaches the leader on it.
	if err := srv.Drop(id); err != nil {
		t.Fatal(err)
	}
	s.h.delayed(id, held, s.h.now())

	// The check of the term is due a renew deadline (and 100 ms) after the
	// observer saw the key gone; the term leads until it is made, or ends.
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
	}
}
