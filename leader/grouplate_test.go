package leader_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// startPatient starts a member on a client that does not give up on a
// silent connection for 30 s (storetest.DialPatient): a Hold of its traffic toward
// the store freezes its path without a reconnect, and what it sent
// meanwhile (slot renewals, term renewals, resigns, joins, campaigns)
// reaches the store when the hold is released, long after it gave up.
func (r *groupRig) startPatient(t *testing.T, name string) *groupMember {
	c := storetest.DialPatient(t, r.srv.Addr(), "adv-"+name)
	g, err := leader.NewGroup(c, "shards", r.elections, []byte(name), append(slices.Clone(r.opts), leader.WithCandidateID(name))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &groupMember{name: name, c: c, g: g, stop: cancel, done: make(chan struct{})}
	go func() {
		m.err = g.Run(ctx, r.work(c))
		close(m.done)
	}()
	t.Cleanup(func() { cancel(); <-m.done })
	r.members = append(r.members, m)
	return m
}

// TestGroupFrozenPathLateDelivery: a member's path to the store
// freezes (the store reads nothing more from it; its connection stays
// up). It loses its slot and its terms on its own clock, and the others
// take its elections once the keys expire. Then the path heals: everything
// it sent meanwhile lands at once, late (renewals of lost terms and of its
// lost slot, resigns, joins of other slots, campaigns). At no moment may
// two works of an election run (the rig's work checks), fenced writes must
// be accepted in token order, and the group must settle balanced.
func TestGroupFrozenPathLateDelivery(t *testing.T) {
	const ttl = time.Second
	r := newGroupRig(t, 12, 200*time.Millisecond, leader.WithTTL(ttl))
	a := r.startPatient(t, "a")
	r.start("b")
	r.start("c")
	r.await("3 members balanced", 10*time.Second, r.balanced)
	orphans := a.g.Leading()
	if err := r.srv.Hold(a.c.ID(), localstore.ToStore); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.await("the frozen member's elections led by the others", 3*ttl+2*time.Second, func() bool {
		return r.othersLead(a, orphans)
	})
	t.Logf("a's %d elections led by the others %v after the freeze", len(orphans), time.Since(start))
	// a keeps trying meanwhile: joins, campaigns, all held.
	time.Sleep(ttl)
	r.srv.Release(a.c.ID())
	r.await("3 members balanced after the heal", 20*time.Second, r.balanced)
	t.Logf("balanced again %v after the freeze", time.Since(start))
	if len(r.live()) != 3 {
		t.Fatalf("a member's Run returned: %s", r.counts())
	}
	if n := r.checkStale(dial(t, r.srv.Addr())); n == 0 {
		t.Log("no ended term to check")
	}
}
