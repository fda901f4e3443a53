package lock_test

import (
	"errors"
	"testing"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A Value too large for the broker is refused by the client: TryLock and
// Lock return sskv.ErrTooLarge at once (Lock used to retry until its
// context ended), the key is untouched, and SetValue of such a value
// leaves the holding and its value as they were.
func TestValueTooLarge(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	big := make([]byte, 5<<20)
	l := newLock(t, c, lock.Config{Name: "l", FenceKey: true, Value: big})
	if ok, err := l.TryLock(ctx); ok || !errors.Is(err, sskv.ErrTooLarge) {
		t.Errorf("TryLock with a 5 MiB Value = %v, %v; want sskv.ErrTooLarge", ok, err)
	}
	if err := l.Lock(ctx); !errors.Is(err, sskv.ErrTooLarge) {
		t.Errorf("Lock with a 5 MiB Value = %v; want sskv.ErrTooLarge", err)
	}
	if h := holder(t, l); h.Held() {
		t.Fatalf("Holder = %+v; want the key untouched", h)
	}

	small := newLock(t, c, lock.Config{Name: "l", FenceKey: true, Value: []byte("v1")})
	mustLock(t, small)
	if err := small.SetValue(ctx, big); !errors.Is(err, sskv.ErrTooLarge) {
		t.Fatalf("SetValue of 5 MiB = %v; want sskv.ErrTooLarge", err)
	}
	if err := small.SetValue(ctx, []byte("v2")); err != nil || small.Err() != nil {
		t.Fatalf("SetValue after: %v (Err %v)", err, small.Err())
	}
	if h := holder(t, small); string(h.Value) != "v2" || h.Token != small.Token() {
		t.Fatalf("Holder = %+v; want v2 under this holding", h)
	}
}
