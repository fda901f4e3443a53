package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A change of the key made after a racing FenceKey waiter's acquisition
// was applied, but before its answers reached the waiter (so before the
// holding took the waiter's watch over), reaches the holding's guard: the
// holding ends as lost, long before its first renewal. The waiter's
// answers are held back to open that window.
func TestChangeBeforeHandoffReachesGuard(t *testing.T) {
	srv := startStore(t)
	admin := dial(t, srv.Addr())
	for _, tc := range []struct {
		name   string
		change func(ctx context.Context, key string, token hlc.Timestamp) error
		want   error
	}{
		{"deleted", func(ctx context.Context, key string, token hlc.Timestamp) error {
			_, err := admin.Del(ctx, key, sskv.DelOptions{FencingToken: token})
			return err
		}, lock.ErrKeyLost},
		{"taken", func(ctx context.Context, key string, token hlc.Timestamp) error {
			_, err := admin.Set(ctx, key, []byte("intruder\n"), sskv.SetOptions{FencingToken: token, Expiry: time.Minute})
			return err
		}, lock.ErrHeldByOther},
		{"taken-then-deleted", func(ctx context.Context, key string, token hlc.Timestamp) error {
			if _, err := admin.Set(ctx, key, []byte("intruder\n"), sskv.SetOptions{FencingToken: token, Expiry: time.Minute}); err != nil {
				return err
			}
			_, err := admin.Del(ctx, key, sskv.DelOptions{FencingToken: token})
			return err
		}, lock.ErrHeldByOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			key := "l-" + tc.name
			// No renewal goes out during the test: only the guard can
			// notice.
			cfg := lock.Config{Name: key, FenceKey: true, TTL: 3 * waitTimeout, Race: true}
			holder := newLock(t, dial(t, srv.Addr()), cfg)
			wc := dial(t, srv.Addr())
			waiter := newLock(t, wc, cfg)
			mustLock(t, holder)
			got := make(chan error, 1)
			go func() { got <- waiter.Lock(ctx) }()
			waitFor(t, "the waiter to watch", func() bool { return srv.Watching(wc.ID(), key) })
			// Every answer to the waiter now comes 1 s late: its fenced SET
			// is applied well before it learns so.
			srv.SetResponseFault(wc.ID(), localstore.ResponseFault{Delay: 2 * time.Second})
			defer srv.SetResponseFault(wc.ID(), localstore.ResponseFault{})
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			var token hlc.Timestamp
			waitFor(t, "the waiter's fenced record", func() bool {
				res, err := admin.Get(ctx, key)
				if err != nil || !res.Found {
					return false
				}
				h := lock.ParseHolder(res.Value, res.Version)
				token = h.Token
				return h.ID == waiter.HolderID() && !token.IsZero()
			})
			select {
			case err := <-got:
				t.Fatalf("Lock returned (%v) before the key could be changed", err)
			default:
			}
			if err := tc.change(ctx, key, token); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("Lock: %v", err)
			}
			srv.SetResponseFault(wc.ID(), localstore.ResponseFault{})
			select {
			case <-waiter.Done():
			case <-time.After(waitTimeout):
				t.Fatal("the holding outlived a change of its key made before the handoff")
			}
			if !errors.Is(waiter.Err(), tc.want) {
				t.Fatalf("Err = %v; want %v", waiter.Err(), tc.want)
			}
			_ = waiter.Unlock(context.Background())
		})
	}
}
