package leader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
)

// A term with WithMaxHold ends at its cap although it renews, and once the
// work has returned and the term is resigned, the waiting candidate leads
// at once: not a TTL (a minute) later.
func TestMaxHoldHandsOver(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const maxHold = 500 * time.Millisecond
	a := campaign(t, dial(t, srv.Addr()), "a", leader.WithTTL(time.Minute), leader.WithMaxHold(maxHold))
	elected := make(chan *leader.Term, 1)
	go func() {
		term, err := leader.Campaign(ctx, dial(t, srv.Addr()), "e", []byte("b"), leader.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		elected <- term
	}()
	select {
	case <-a.Done():
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("the term outlived its MaxHold")
	}
	if err := a.Err(); !errors.Is(err, leader.ErrLost) || !errors.Is(err, lock.ErrMaxHold) {
		t.Fatalf("Err = %v; want ErrLost and lock.ErrMaxHold", err)
	}
	// The work returns, then the term is given up.
	resigned := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("Resign after the cap = %v", err)
	}
	select {
	case b := <-elected:
		if b == nil {
			t.FailNow()
		}
		t.Logf("the waiting candidate led %v after the capped term was resigned", time.Since(resigned))
		_ = b.Resign(ctx)
	case <-time.After(storetest.WaitTimeout):
		t.Fatal("the waiting candidate was not elected after the capped term was resigned")
	}
}

// Resign with a context that has ended already still gives the election up
// at once.
func TestResignWithEndedContext(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	a := campaign(t, c, "a", leader.WithTTL(time.Minute))
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Resign(ended); err != nil {
		t.Fatalf("Resign with an ended context = %v; want nil", err)
	}
	if s, err := leader.Leader(ctx, c, "e"); err != nil || s.HasLeader() {
		t.Fatalf("Leader after Resign = %+v, %v; want nobody", s, err)
	}
}
