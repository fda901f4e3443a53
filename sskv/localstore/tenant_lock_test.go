package localstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// TestTenantForgedWillsLeaderAndLock (issue 16, item 1, on the victim's
// side): bob's leader, his observer and his lock holder, all on dsslock's
// own packages, are not misled by the Wills alice would leave on their
// notification topics. Before the store checked Wills, the retained forged
// SET made Observe report alice's fake leader and, stamped 50 s ahead, hid
// bob's genuine Proclaim; the forged DELETE ended bob's term, and the forged
// SET ended the FenceKey lock's holding.
func TestTenantForgedWillsLeaderAndLock(t *testing.T) {
	srv := startTenants(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*waitTimeout)
	defer cancel()
	dialBob := func(id string) *sskv.Client {
		c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id, Username: bob.username, Password: []byte(bob.password),
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
		if err != nil {
			t.Fatalf("Dial %s: %v", id, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	leaderC, observerC, holderC := dialBob("bob-leader"), dialBob("bob-observer"), dialBob("bob-holder")

	term, err := leader.Campaign(ctx, leaderC, "b/e", []byte("v1"))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	t.Cleanup(func() { _ = term.Resign(context.Background()) })
	states, err := leader.Observe(ctx, observerC, "b/e")
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	if s := <-states; s.ID != term.CandidateID() || string(s.Value) != "v1" {
		t.Fatalf("first state %+v, want bob's term", s)
	}
	l, err := lock.New(holderC, lock.Config{Name: "b/l", FenceKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Lock(ctx); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	ts := aheadTS(t)
	for _, w := range []*packets.Connect{
		will("mallory", wire.NotifyTopic(observerC.ID(), []byte("b/e")), true, notifySet(fmt.Sprintf("mallory\n%s\nfake", ts)), ts),
		will("mallory", wire.NotifyTopic(leaderC.ID(), []byte("b/e")), false, notifyDelete, ts),
		will("mallory", wire.NotifyTopic(holderC.ID(), []byte("b/l")), false, notifySet("mallory"), ts),
	} {
		rc, ca := connectRaw(t, srv, w)
		if ca.ReasonCode != reasonNotAuthorized {
			t.Errorf("alice's CONNECT with a Will on %q: CONNACK 0x%02x, want 0x87", w.WillTopic, ca.ReasonCode)
			dropAndWait(t, srv, rc)
		}
	}

	if err := term.Proclaim(ctx, []byte("v2")); err != nil {
		t.Fatalf("Proclaim: %v", err)
	}
	for {
		var s leader.State
		select {
		case s = <-states:
		case <-ctx.Done():
			t.Fatal("the observer never reported bob's Proclaim")
		}
		if s.ID != term.CandidateID() {
			t.Fatalf("the observer reported %+v, not bob's term", s)
		}
		if string(s.Value) == "v2" {
			break
		}
	}
	if err := term.Err(); err != nil {
		t.Fatalf("bob's term ended: %v", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("bob's lock lost: %v", err)
	}
}
