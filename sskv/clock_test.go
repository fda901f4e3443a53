package sskv_test

// A client whose clock runs ahead of the store's: the store refuses a __ts
// or __ft more than a minute ahead of its clock.

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// skewedBy makes a client's hybrid logical clock read the wall clock
// shifted by skew (nanoseconds), which the test may change at any time.
func skewedBy(skew *atomic.Int64) func(*sskv.Config) {
	return func(cfg *sskv.Config) {
		cfg.WallClock = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	}
}

func skewOf(d time.Duration) *atomic.Int64 {
	var s atomic.Int64
	s.Store(int64(d))
	return &s
}

// refusedForSkew checks that call fails with the store's timestamp skew
// refusal, at once, with a message that tells what to do, having sent at
// most maxRequests requests.
func refusedForSkew(t *testing.T, srv *localstore.Server, c *sskv.Client, op string, maxRequests int64, call func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before, start := srv.Requests(c.ID()), time.Now()
	err := call(ctx)
	took, sent := time.Since(start), srv.Requests(c.ID())-before
	t.Logf("%s: %v (after %v, %d requests)", op, err, took, sent)
	var se *sskv.ServiceError
	if !errors.Is(err, sskv.ErrTimestampSkew) || !errors.As(err, &se) {
		t.Fatalf("%s = %v; want a *ServiceError matching ErrTimestampSkew", op, err)
	}
	if !strings.Contains(err.Error(), "ensure that the client and broker system clocks are synchronized") {
		t.Errorf("%s: the error %q does not tell to synchronise the clocks", op, err)
	}
	if took > 2*time.Second || ctx.Err() != nil {
		t.Errorf("%s took %v; want the refusal at once", op, took)
	}
	if sent < 1 || sent > maxRequests {
		t.Errorf("%s sent %d requests; want 1 to %d (a refusal is not retried)", op, sent, maxRequests)
	}
}

// With its clock two minutes ahead, every request of a client is refused
// at once with ErrTimestampSkew, one request each, and a later request is
// refused the same way (nothing hangs, nothing is retried).
func TestClockAheadRefused(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv, skewedBy(skewOf(2*time.Minute)))
	refusedForSkew(t, srv, c, "SET", 1, func(ctx context.Context) error {
		_, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{})
		return err
	})
	refusedForSkew(t, srv, c, "SET NX PX", 1, func(ctx context.Context) error {
		_, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{Condition: sskv.IfNotExists, Expiry: time.Second})
		return err
	})
	refusedForSkew(t, srv, c, "GET", 1, func(ctx context.Context) error {
		_, err := c.Get(ctx, "k")
		return err
	})
	refusedForSkew(t, srv, c, "DEL", 1, func(ctx context.Context) error {
		_, err := c.Del(ctx, "k", sskv.DelOptions{})
		return err
	})
	refusedForSkew(t, srv, c, "VDEL", 1, func(ctx context.Context) error {
		_, err := c.VDel(ctx, "k", []byte("v"), sskv.DelOptions{})
		return err
	})
	// The refused KEYNOTIFY is followed by a KEYNOTIFY STOP (refused too),
	// which the client sends whenever a registration fails.
	refusedForSkew(t, srv, c, "watch", 2, func(ctx context.Context) error {
		w, err := c.Watch(ctx, "k")
		if err == nil {
			w.Stop()
		}
		return err
	})
	if srv.Watching(c.ID(), "k") {
		t.Errorf("the refused watch is registered")
	}
	// Nothing was written, and an accurate client works.
	if res, err := dial(t, srv).Get(testCtx(t), "k"); err != nil || res.Found {
		t.Fatalf("GET by an accurate client = %+v, %v; want no key", res, err)
	}
}

// A fencing token more than a minute ahead of the store's clock is refused
// with ErrFencingTokenSkew, whatever the client's own clock.
func TestFencingTokenAheadRefused(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ft := hlc.Timestamp{Wall: time.Now().Add(2 * time.Minute).UnixMilli(), Node: "elsewhere"}
	before, start := srv.Requests(c.ID()), time.Now()
	_, err := c.Set(testCtx(t), "k", []byte("v"), sskv.SetOptions{FencingToken: ft})
	t.Logf("SET with a token 2 min ahead: %v (after %v, %d requests)", err, time.Since(start), srv.Requests(c.ID())-before)
	if !errors.Is(err, sskv.ErrFencingTokenSkew) || !strings.Contains(err.Error(), "clocks are synchronized") {
		t.Fatalf("SET = %v; want ErrFencingTokenSkew telling to synchronise the clocks", err)
	}
	if n := srv.Requests(c.ID()) - before; n != 1 {
		t.Errorf("%d requests; want 1", n)
	}
}

// A clock less than a minute ahead is accepted. The versions the store
// gives follow the client's clock (30 s ahead), and a client with an
// accurate clock that writes the key next still gets a greater version.
func TestClockAheadWithinDrift(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ahead := dial(t, srv, skewedBy(skewOf(30*time.Second)))
	accurate := dial(t, srv)
	ctx := testCtx(t)
	res, err := ahead.Set(ctx, "k", []byte("ahead"), sskv.SetOptions{Expiry: time.Minute})
	if err != nil || !res.Applied {
		t.Fatalf("SET 30 s ahead = %+v, %v", res, err)
	}
	if d := time.Until(time.UnixMilli(res.Version.Wall)); d < 25*time.Second || d > 35*time.Second {
		t.Errorf("version %v is %v ahead of real time; want ~30 s", res.Version, d)
	}
	if g, err := ahead.Get(ctx, "k"); err != nil || string(g.Value) != "ahead" || g.Version != res.Version {
		t.Fatalf("GET 30 s ahead = %+v, %v", g, err)
	}
	next, err := accurate.Set(ctx, "k", []byte("accurate"), sskv.SetOptions{})
	if err != nil || !next.Version.After(res.Version) {
		t.Fatalf("SET by an accurate client = %+v, %v; want a version after %v", next, err, res.Version)
	}
	if d, err := ahead.Del(ctx, "k", sskv.DelOptions{}); err != nil || !d.Deleted {
		t.Fatalf("DEL 30 s ahead = %+v, %v", d, err)
	}
}

// A clock that was more than a minute ahead and is set right again: the
// client's hybrid logical clock never goes back, so its requests stay
// stamped at the furthest time it read, and are refused, with the same
// clear error, until real time has caught up with that reading.
func TestClockAheadThenCorrected(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	skew := skewOf(2 * time.Minute)
	c := dial(t, srv, skewedBy(skew))
	get := func(ctx context.Context) error {
		_, err := c.Get(ctx, "k")
		return err
	}
	refusedForSkew(t, srv, c, "GET 2 min ahead", 1, get)
	skew.Store(0)
	refusedForSkew(t, srv, c, "GET once the clock is right again", 1, get)
}
