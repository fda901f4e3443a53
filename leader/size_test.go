package leader_test

import (
	"errors"
	"testing"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/sskv"
)

// A leader's fenced write larger than the broker takes fails at once, and
// the term carries on: it is not lost, it renews, and it writes again.
// (A 5 MiB write used to take the connection down, over and over, and the
// term was lost within its renew deadline.)
func TestTooLargeWriteKeepsTheTerm(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	term := campaign(t, c, "a")
	w := fenced.New(c, term)
	ctx := testCtx(t)
	cn, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := w.Set(ctx, "big", make([]byte, 5<<20), sskv.SetOptions{}); !errors.Is(err, sskv.ErrTooLarge) {
		t.Fatalf("5 MiB fenced Set = %v; want sskv.ErrTooLarge", err)
	}
	if errors.Is(err, fenced.ErrStale) || term.Err() != nil {
		t.Fatalf("the term ended: %v", term.Err())
	}
	if _, err := w.Set(ctx, "small", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatalf("fenced Set after the refusal: %v", err)
	}
	if err := term.Proclaim(ctx, []byte("still here")); err != nil {
		t.Fatalf("Proclaim after the refusal: %v", err)
	}
	select {
	case <-term.Done():
		t.Fatalf("the term ended: %v", term.Err())
	default:
	}
	if now, err := c.Connection(ctx); err != nil || now != cn {
		t.Fatalf("the client reconnected (%v)", err)
	}
	if s := currentLeader(t, c); s.ID != term.CandidateID() || string(s.Value) != "still here" {
		t.Fatalf("leader %+v; want this term, proclaimed", s)
	}
}
