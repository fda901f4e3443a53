package leader_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Campaign in an election whose key holds something that will never be
// released to a candidate fails at once, with an error wrapping
// lock.ErrNotALock that says what the key holds, where it used to wait
// until its context ended: a semaphore's record, a value no lock writes,
// and a holder's name alone, as the Azure IoT Operations SDK's leased lock
// writes it (with an expiry), which an election cannot share a key with.
func TestCampaignNotALock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value []byte
		opts  sskv.SetOptions
		want  []string
	}{
		{"semaphore", lock.SemaphoreRecord(2), sskv.SetOptions{Condition: sskv.IfNotExists}, []string{"semaphore's record", "never expires"}},
		{"SDK", []byte("sdk-replica-1"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: time.Minute},
			[]string{`"sdk-replica-1"`, "another client's lock", "SDK's leased lock", "cannot share a key"}},
		{"other", []byte("a\nb"), sskv.SetOptions{}, []string{"no lock writes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t) // far longer than the bound below
			c := dial(t, srv.Addr())
			if _, err := c.Set(ctx, "e", tc.value, tc.opts); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			term, err := leader.Campaign(ctx, c, "e", []byte("10.0.0.1:80"))
			took := time.Since(start)
			if term != nil {
				_ = term.Resign(context.Background())
				t.Fatal("Campaign won")
			}
			if !errors.Is(err, lock.ErrNotALock) {
				t.Fatalf("Campaign = %v after %v; want an error wrapping lock.ErrNotALock", err, took)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if took > 2*time.Second {
				t.Errorf("Campaign took %v to fail; want within 2 s", took)
			}
			t.Logf("%v after %v", err, took)
			if res, err := c.Get(ctx, "e"); err != nil || string(res.Value) != string(tc.value) {
				t.Errorf("the key holds %q, %v after the campaign; want it left as it was", res.Value, err)
			}
		})
	}
}
