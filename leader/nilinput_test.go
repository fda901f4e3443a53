package leader_test

import (
	"errors"
	"testing"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// A nil client or a nil work function is a configuration error, never a
// panic (Observe, Leader and Elector.Run used to panic; Run only after it
// had won the election).
func TestNilInputs(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	var nilc *sskv.Client
	e, err := leader.NewElector(c, "e", nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"Observe(nil client)":  func() error { _, err := leader.Observe(ctx, nilc, "e"); return err },
		"Leader(nil client)":   func() error { _, err := leader.Leader(ctx, nilc, "e"); return err },
		"Leaders(nil client)":  func() error { _, err := leader.Leaders(ctx, nilc, []string{"e"}); return err },
		"Campaign(nil client)": func() error { _, err := leader.Campaign(ctx, nilc, "e", nil); return err },
		"Elector.Run(nil)":     func() error { return e.Run(ctx, nil) },
	} {
		if err := call(); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("%s = %v; want ErrConfig", name, err)
		}
	}
	if s := currentLeader(t, c); s.HasLeader() {
		t.Fatalf("leader %+v after Run(nil); want none: nothing campaigned", s)
	}
}
