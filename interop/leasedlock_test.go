package interop

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	sserrors "github.com/Azure/iot-operations-sdks/go/services/statestore/errors"
)

// changes buffers a leasedlock Observe channel (which is unbuffered and
// would otherwise block the SDK's notification delivery).
type changes struct {
	e  *env
	ch chan leasedlock.Change
}

func (e *env) observe(l *leasedlock.Lease[string, string]) *changes {
	src, done := l.Observe()
	c := &changes{e: e, ch: make(chan leasedlock.Change, 1024)}
	go func() {
		defer close(c.ch)
		for ch := range src {
			c.ch <- ch
		}
	}()
	e.t.Cleanup(done)
	return c
}

func (c *changes) next(what string) leasedlock.Change {
	c.e.t.Helper()
	ctx, cancel := c.e.waitCtx()
	defer cancel()
	select {
	case ch, ok := <-c.ch:
		if !ok {
			c.e.t.Fatalf("observe channel closed while waiting for %s", what)
		}
		return ch
	case <-ctx.Done():
		c.e.t.Fatalf("no lease change within %s while waiting for %s", waitTimeout, what)
	}
	panic("unreachable")
}

func (c *changes) expect(held bool, holder, what string) {
	c.e.t.Helper()
	got := c.next(what)
	if got.Held != held || got.Holder != holder {
		c.e.t.Fatalf("lease change = %+v, want {Held:%v Holder:%q} (%s)", got, held, holder, what)
	}
}

func (c *changes) expectEmpty(why string) {
	c.e.t.Helper()
	for {
		select {
		case ch, ok := <-c.ch:
			if !ok {
				return
			}
			c.e.t.Errorf("unexpected lease change %+v (%s)", ch, why)
		default:
			return
		}
	}
}

func wantHolder(t *testing.T, ctx context.Context, l *leasedlock.Lease[string, string], holder string, held bool) {
	t.Helper()
	h, ok, err := l.Holder(ctx)
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	if h != holder || ok != held {
		t.Errorf("Holder = %q, %v; want %q, %v", h, ok, holder, held)
	}
}

func TestLease(t *testing.T) {
	e := newEnv(t)
	a := e.newClient("lease-a")
	b := e.newClient("lease-b")
	ctx := e.ctx
	name := e.key("lease")

	la := leasedlock.NewLease(a.ss, name)
	lb := leasedlock.NewLease(b.ss, name)

	// B watches who holds the lease.
	if err := lb.ObserveStart(ctx); err != nil {
		t.Fatalf("ObserveStart: %v", err)
	}
	obs := e.observe(lb)

	ok, err := la.Acquire(ctx, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("A Acquire = %v, %v; want true", ok, err)
	}
	obs.expect(true, a.id, "A acquired")
	tokA, err := la.Token(ctx)
	if err != nil || tokA.IsZero() {
		t.Fatalf("A Token = %v, %v; want a fencing token", tokA, err)
	}

	ok, err = lb.Acquire(ctx, 10*time.Second)
	if err != nil || ok {
		t.Fatalf("B Acquire while A holds = %v, %v; want false, nil", ok, err)
	}
	if _, err := lb.Token(ctx); !errors.Is(err, leasedlock.ErrNoLease) {
		t.Errorf("B Token after a refused Acquire: %v, want ErrNoLease", err)
	}
	wantHolder(t, ctx, lb, a.id, true)

	// Renew (one more NEX Acquire): still A's, strictly newer token.
	ok, err = la.Acquire(ctx, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("A renew = %v, %v; want true", ok, err)
	}
	obs.expect(true, a.id, "A renewed")
	tokA2, err := la.Token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantNewer(t, "renewed lease token", tokA2, tokA)

	if err := la.Release(ctx); err != nil {
		t.Fatalf("A Release: %v", err)
	}
	obs.expect(false, "", "A released")
	wantHolder(t, ctx, la, "", false)
	if _, err := la.Token(ctx); !errors.Is(err, leasedlock.ErrNoLease) {
		t.Errorf("A Token after Release: %v, want ErrNoLease", err)
	}

	ok, err = lb.Acquire(ctx, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("B Acquire after A released = %v, %v; want true", ok, err)
	}
	obs.expect(true, b.id, "B acquired")

	// A releasing a lease it does not hold changes nothing (VDEL -> -1).
	if err := la.Release(ctx); err != nil {
		t.Errorf("A Release of B's lease: %v, want nil", err)
	}
	wantHolder(t, ctx, la, b.id, true)

	if err := lb.Release(ctx); err != nil {
		t.Fatalf("B Release: %v", err)
	}
	obs.expect(false, "", "B released (and nothing from A's no-op release before it)")

	t.Run("Expiry", func(t *testing.T) {
		ok, err := la.Acquire(ctx, 400*time.Millisecond)
		if err != nil || !ok {
			t.Fatalf("A Acquire 400ms = %v, %v", ok, err)
		}
		obs.expect(true, a.id, "A acquired for 400ms")
		obs.expect(false, "", "A's lease expired")
		ok, err = lb.Acquire(ctx, 10*time.Second)
		if err != nil || !ok {
			t.Fatalf("B Acquire after A's lease expired = %v, %v", ok, err)
		}
		obs.expect(true, b.id, "B acquired")
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		obs.expect(false, "", "B released")
	})

	t.Run("AutoRenew", func(t *testing.T) {
		// The SDK renews every `every` on a timer; the margin to `dur` is
		// generous because a loaded machine (e.g. -race on 2 CPUs) can stall
		// the test process for over half a second, and then the store
		// rightly lets the lease lapse.
		const dur, every = 1500 * time.Millisecond, 150 * time.Millisecond

		// A renewing holder on its own client. It is ended by closing that
		// client (the holder going away), not by Release: in SDK v0.4.1,
		// Release after WithRenew leaves the renew goroutine spinning on a
		// cancelled context forever (select { case <-time.After(renew): ...
		// case <-ctx.Done(): } in a loop), burning a CPU for the rest of the
		// process. A closed client makes the next renewal fail, which ends it.
		r := e.newClient("lease-renew")
		lr := leasedlock.NewLease(r.ss, name)

		start := time.Now()
		ok, err := lr.Acquire(ctx, dur, leasedlock.WithRenew(every))
		if err != nil || !ok {
			t.Fatalf("Acquire with renew = %v, %v", ok, err)
		}
		if _, err := lr.Acquire(ctx, dur, leasedlock.WithRenew(every)); !errors.Is(err, leasedlock.ErrRenewing) {
			t.Errorf("second renewing Acquire: %v, want ErrRenewing", err)
		}
		first, err := lr.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		obs.expect(true, r.id, "acquired with renew")
		// Each renewal is a SET notification: the signal to wait on. Hold
		// on past two lease durations; a DELETE would mean it lapsed.
		renewals := 0
		for time.Since(start) < 2*dur {
			obs.expect(true, r.id, "renewal")
			renewals++
		}
		if renewals < 3 {
			t.Errorf("only %d renewals in %v", renewals, time.Since(start))
		}
		ok, err = lb.Acquire(ctx, 10*time.Second)
		if err != nil || ok {
			t.Errorf("B Acquire while the holder renews = %v, %v; want false", ok, err)
		}
		wantHolder(t, ctx, lb, r.id, true)
		last, err := lr.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wantNewer(t, "token after renewals", last, first)

		// The holder goes away: renewals stop, the lease expires.
		r.close()
		for {
			ch := obs.next("DELETE (expiry) after the holder went away")
			if !ch.Held {
				break
			}
			if ch.Holder != r.id {
				t.Fatalf("lease change %+v, want a last renewal or the expiry", ch)
			}
		}
		wantHolder(t, ctx, lb, "", false)
		ok, err = lb.Acquire(ctx, 10*time.Second)
		if err != nil || !ok {
			t.Fatalf("B Acquire after the holder's lease expired = %v, %v", ok, err)
		}
		obs.expect(true, b.id, "B acquired")
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		obs.expect(false, "", "B released")
	})

	t.Run("SessionID", func(t *testing.T) {
		n := e.key("sessions")
		one := leasedlock.NewLease(a.ss, n, leasedlock.WithSessionID("one"))
		two := leasedlock.NewLease(a.ss, n, leasedlock.WithSessionID("two"))
		if ok, err := one.Acquire(ctx, 10*time.Second); err != nil || !ok {
			t.Fatalf("session one Acquire = %v, %v", ok, err)
		}
		if ok, err := two.Acquire(ctx, 10*time.Second); err != nil || ok {
			t.Errorf("session two Acquire = %v, %v; want false", ok, err)
		}
		wantHolder(t, ctx, two, a.id+":one", true)
		if err := one.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if ok, err := two.Acquire(ctx, 10*time.Second); err != nil || !ok {
			t.Errorf("session two Acquire after release = %v, %v", ok, err)
		}
		if err := two.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

	if err := lb.ObserveStop(ctx); err != nil {
		t.Errorf("ObserveStop: %v", err)
	}
	// Round trip on B's session after the stop, then nothing may be pending.
	wantHolder(t, ctx, lb, "", false)
	obs.expectEmpty("end of test")
}

func TestLockBlocking(t *testing.T) {
	e := newEnv(t)
	a := e.newClient("lock-a")
	b := e.newClient("lock-b")
	ctx := e.ctx
	name := e.key("lock")

	lka := leasedlock.NewLock(a.ss, name)
	lkb := leasedlock.NewLock(b.ss, name)

	if err := lka.Lock(ctx, time.Minute); err != nil {
		t.Fatalf("A Lock: %v", err)
	}
	tokA, err := lka.Token(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Signal that B's acquire attempt was refused: the store's ":-1" reply
	// to B's SET NEX arrives on B's response topic. From then on B can only
	// get the lock through a DELETE notification (A's lease is a minute,
	// B waits at most 20 s).
	refused := make(chan struct{}, 1)
	e.rawWatch(b, func(m *mqtt.Message) {
		if strings.HasSuffix(m.Topic, "/response") && bytes.HasPrefix(m.Payload, []byte(":-1")) {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	})

	res := make(chan error, 1)
	go func() {
		res <- lkb.Lock(ctx, time.Minute, leasedlock.WithTimeout(20*time.Second))
	}()

	wctx, cancel := e.waitCtx()
	select {
	case <-refused:
	case err := <-res:
		cancel()
		t.Fatalf("B Lock returned %v while A held the lock", err)
	case <-wctx.Done():
		cancel()
		t.Fatalf("no refused SET for B within %s", waitTimeout)
	}
	cancel()

	select {
	case err := <-res:
		t.Fatalf("B Lock returned %v while A held the lock", err)
	default:
	}
	wantHolder(t, ctx, lkb.Lease, a.id, true)

	if err := lka.Unlock(ctx); err != nil {
		t.Fatalf("A Unlock: %v", err)
	}

	wctx, cancel = e.waitCtx()
	defer cancel()
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("B Lock after A unlocked: %v", err)
		}
	case <-wctx.Done():
		t.Fatalf("B Lock did not return within %s of A's Unlock (DELETE notification not delivered?)", waitTimeout)
	}

	wantHolder(t, ctx, lka.Lease, b.id, true)
	tokB, err := lkb.Token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantNewer(t, "B's token vs A's", tokB, tokA)
	if err := lkb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantHolder(t, ctx, lka.Lease, "", false)
}

func TestLockEdit(t *testing.T) {
	const n = 15

	e := newEnv(t)
	a := e.newClient("edit-a")
	b := e.newClient("edit-b")
	ctx := e.ctx
	lockName := e.key("lock")
	counter := e.key("counter")

	var calls atomic.Int32
	incr := func(_ context.Context, v string, ok bool) (string, bool, error) {
		calls.Add(1)
		x := 0
		if ok {
			var err error
			if x, err = strconv.Atoi(v); err != nil {
				return "", false, err
			}
		}
		return strconv.Itoa(x + 1), true, nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for _, c := range []*client{a, b} {
		l := leasedlock.NewLock(c.ss, lockName)
		wg.Go(func() {
			for range n {
				if err := l.Edit(ctx, counter, 10*time.Second, incr, leasedlock.WithTimeout(20*time.Second)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Edit: %v", err)
	}

	g, err := a.ss.Get(ctx, counter)
	if err != nil {
		t.Fatal(err)
	}
	if g.Value != strconv.Itoa(2*n) {
		t.Errorf("counter = %q after %d increments from each of two clients, want %q (edit callbacks: %d)", g.Value, n, strconv.Itoa(2*n), calls.Load())
	}
	wantHolder(t, ctx, leasedlock.NewLease(a.ss, lockName), "", false)

	// Edit writes under the lock's fencing token, so a plain write is refused.
	_, err = b.ss.Set(ctx, counter, "bypass")
	wantServiceError(t, "Set without token on a key written by Edit", err, wireFencingRequired, sserrors.MissingFencingToken)

	// An Edit that deletes (returns false) uses DEL with the token.
	l := leasedlock.NewLock(b.ss, lockName)
	del := func(context.Context, string, bool) (string, bool, error) { return "", false, nil }
	if err := l.Edit(ctx, counter, 10*time.Second, del); err != nil {
		t.Fatalf("deleting Edit: %v", err)
	}
	if g, err := a.ss.Get(ctx, counter); err != nil || !g.Version.IsZero() {
		t.Errorf("Get after deleting Edit = %+v, %v; want a miss", g, err)
	}
}
