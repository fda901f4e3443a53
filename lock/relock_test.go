package lock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A plain Lock (no FenceKey) whose Unlock could not reach the store
// (ErrNotReleased) leaves its record on the key until it expires. Locking
// again, it must not take that record as a FenceKey reservation: a fenced
// SET would fence a plain lock's key, so that its own Unlock (an unfenced
// VDEL) is refused, and the official SDK's leased lock, which shares plain
// keys, is told "a fencing token is required" instead of waiting.
func TestPlainRelockLeavesKeyUnfenced(t *testing.T) {
	for _, race := range []bool{false, true} {
		t.Run(map[bool]string{false: "queued", true: "Race"}[race], func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			l := newLock(t, dial(t, proxy.Addr()), lock.Config{Name: "k", TTL: time.Second, Race: race})
			if err := l.Lock(ctx); err != nil {
				t.Fatalf("Lock: %v", err)
			}
			proxy.Partition()
			if err := l.Unlock(ctx); !errors.Is(err, lock.ErrNotReleased) {
				t.Fatalf("Unlock with the store away = %v, want ErrNotReleased", err)
			}
			proxy.Heal()
			if err := l.Lock(ctx); err != nil {
				t.Fatalf("Lock again: %v", err)
			}
			other := dial(t, srv.Addr())
			if res, err := other.Set(ctx, "k", []byte("x"), sskv.SetOptions{Condition: sskv.IfNotExists}); err != nil || res.Applied {
				t.Fatalf("an unfenced SET NX of the held key = %+v, %v; want not applied (held), not fenced", res, err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			if g, err := other.Get(ctx, "k"); err != nil || g.Found {
				t.Fatalf("key after Unlock = %q, %v; want it deleted", g.Value, err)
			}
		})
	}
}
