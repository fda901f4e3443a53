package lock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
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

// A FenceKey Value whose first record fits the broker's packets, but not
// the second, which adds the token: the acquisition is refused with
// sskv.ErrTooLarge, and gives the key back. It used to be reported as an
// answer that came too late: TryLock returned false and no error, and Lock
// retried until its context ended.
func TestValueTooLargeOnlyWithToken(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{MaxPacketSize: 2048})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	tryLock := func(size int) (bool, error) {
		l := newLock(t, c, lock.Config{Name: "l", HolderID: "h", FenceKey: true, Value: make([]byte, size)})
		ok, err := l.TryLock(ctx)
		if ok {
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			settle(t, l) // a refused second SET gives the key back in the background
		}
		return ok, err
	}
	// The smallest Value refused: its second record, the longer, does not
	// fit; its first does, and goes out.
	lo, hi := 0, 2048
	for lo < hi {
		mid := (lo + hi) / 2
		if _, err := tryLock(mid); errors.Is(err, sskv.ErrTooLarge) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	before := srv.Requests(c.ID())
	if ok, err := tryLock(lo); ok || !errors.Is(err, sskv.ErrTooLarge) {
		t.Fatalf("TryLock with a %d-byte Value = %v, %v; want sskv.ErrTooLarge", lo, ok, err)
	}
	if srv.Requests(c.ID()) == before {
		t.Fatalf("the smallest Value refused (%d bytes) sent nothing: its first record is too large, and so an acquisition with a second record too large is not reported as refused", lo)
	}
	waitFor(t, "the refused acquisition to give the key back", func() bool {
		return !holder(t, newLock(t, c, lock.Config{Name: "l"})).Held()
	})
	for size := max(lo-40, 0); size < lo; size++ {
		if ok, err := tryLock(size); !ok || err != nil {
			t.Fatalf("TryLock with a %d-byte Value (the first refused is %d) = %v, %v; want it held", size, lo, ok, err)
		}
	}
	// Lock gives up at once too.
	l := newLock(t, c, lock.Config{Name: "l", HolderID: "h", FenceKey: true, Value: make([]byte, lo)})
	if err := l.Lock(ctx); !errors.Is(err, sskv.ErrTooLarge) {
		t.Errorf("Lock with a %d-byte Value, whose second record does not fit = %v; want sskv.ErrTooLarge", lo, err)
	}
}

// An acquisition that fails at once says why, not that it was not answered
// in time (every failure used to be labelled so).
func TestAcquisitionErrorSaysWhy(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	l := newLock(t, c, lock.Config{Name: "l"})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := l.TryLock(testCtx(t))
	if !errors.Is(err, sskv.ErrClosed) || strings.Contains(err.Error(), "not answered") {
		t.Errorf("TryLock on a closed client = %v; want sskv.ErrClosed, not called unanswered", err)
	}
}
