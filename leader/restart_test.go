package leader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
)

// The store is closed, and a new one starts on the same address 2.5 s
// later: every key is gone. The leader reconnects within its renew
// deadline; its term must end, not go on and re-create the key with its
// next renewal.
func TestStoreRestartEndsTerm(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	term := campaign(t, c, "a", leader.WithTTL(6*time.Second))
	down := time.Now()
	srv = storetest.Restart(t, srv, 2500*time.Millisecond)
	select {
	case <-term.Done():
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("the term survived a store restart that lost its key")
	}
	if !errors.Is(term.Err(), leader.ErrLost) || !errors.Is(term.Err(), lock.ErrKeyLost) {
		t.Fatalf("term.Err = %v; want ErrLost and lock.ErrKeyLost", term.Err())
	}
	if took := time.Since(down); took >= 4*time.Second {
		t.Errorf("the term ended %v after the store went down, past its renew deadline", took)
	}
	if s := currentLeader(t, dial(t, srv.Addr())); s.HasLeader() {
		t.Fatalf("leader after the restart: %+v; want none", s)
	}
	if err := term.Resign(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// A leader may resign from its renewal metric hook (after a failed
// renewal, say): the hook runs off the renew loop, so Resign does not
// deadlock waiting for it.
func TestResignFromRenewalHook(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	var term *leader.Term
	ready := make(chan struct{})
	resigned := make(chan error, 1)
	var once sync.Once
	term = campaign(t, c, "a", leader.WithTTL(300*time.Millisecond), leader.WithMetrics(leader.Metrics{
		Renewal: func(time.Duration, error) {
			<-ready
			once.Do(func() { resigned <- term.Resign(context.Background()) })
		},
	}))
	close(ready)
	select {
	case err := <-resigned:
		if err != nil {
			t.Fatalf("Resign from the renewal hook: %v", err)
		}
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("Resign from the renewal hook did not return")
	}
	if !errors.Is(term.Err(), leader.ErrResigned) {
		t.Fatalf("term.Err = %v; want ErrResigned", term.Err())
	}
}
