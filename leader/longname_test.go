package leader_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// An election name too long to watch is a configuration error, given at
// once by Campaign, NewElector, NewGroup and Observe, and the client's
// other terms carry on. (A 40,000-byte name used to return a term, then
// take the client offline for good, ending every term on it.)
func TestElectionNameTooLong(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	other := campaign(t, c, "a")
	long := strings.Repeat("e", 40000)

	start := time.Now()
	if _, err := leader.Campaign(ctx, c, long, nil); !errors.Is(err, leader.ErrConfig) || !errors.Is(err, sskv.ErrKeyTooLong) {
		t.Errorf("Campaign = %.200v; want ErrConfig and sskv.ErrKeyTooLong", err)
	}
	if _, err := leader.NewElector(c, long, nil); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("NewElector = %.200v; want ErrConfig", err)
	}
	if _, err := leader.NewGroup(c, "g", []string{"a", long, "b"}, nil); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("NewGroup with one long election = %.200v; want ErrConfig", err)
	}
	if _, err := leader.NewGroup(c, long, []string{"a"}, nil); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("NewGroup with a long group name = %.200v; want ErrConfig", err)
	}
	if _, err := leader.Observe(ctx, c, long); !errors.Is(err, sskv.ErrKeyTooLong) {
		t.Errorf("Observe = %.200v; want sskv.ErrKeyTooLong", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refusals took %v", d)
	}

	if err := other.Proclaim(ctx, []byte("still here")); err != nil || other.Err() != nil {
		t.Fatalf("the other term: Proclaim %v, Err %v", err, other.Err())
	}
	if s := currentLeader(t, c); s.ID != other.CandidateID() || string(s.Value) != "still here" {
		t.Fatalf("leader %+v; want the other term", s)
	}
}
