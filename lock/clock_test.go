package lock_test

// Clock faults: a holder whose clock runs ahead of the store's (the store
// refuses requests stamped more than a minute ahead of its clock), and a
// store whose clock jumps forward and back.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// clockTTL is the lease of these tests: renewals every 333 ms, lost at
// 666 ms without one; enough for -race on a loaded machine.
const clockTTL = time.Second

// promptly bounds how long a refused call may take, against the 10 s its
// context allows: one round trip, on a loaded machine.
const promptly = 2 * time.Second

var (
	dialSkewed = storetest.DialSkewed
	skewOf     = storetest.Skew
)

// renewals returns an OnRenewal hook and a function that waits for n
// successful renewals reported after it is called.
func renewals(t *testing.T) (func(time.Duration, error), func(n int)) {
	ch := make(chan error, 1024)
	hook := func(_ time.Duration, err error) {
		select {
		case ch <- err:
		default:
		}
	}
	wait := func(n int) {
		t.Helper()
		for len(ch) > 0 {
			<-ch
		}
		timer := time.NewTimer(waitTimeout)
		defer timer.Stop()
		for n > 0 {
			select {
			case err := <-ch:
				if err == nil {
					n--
				}
			case <-timer.C:
				t.Fatalf("timed out waiting for %d more successful renewals", n)
			}
		}
	}
	return hook, wait
}

// waitDone waits for l's holding to end, at most waitTimeout, and returns
// when it did.
func waitDone(t *testing.T, l *lock.Lock) time.Time {
	t.Helper()
	select {
	case <-l.Done():
		return time.Now()
	case <-time.After(waitTimeout):
		t.Fatalf("the holding did not end within %v", waitTimeout)
	}
	panic("unreachable")
}

// settle waits until l has sent everything for its last acquisition: a
// failed acquisition may delete what it wrote in the background, holding
// the Lock's turn, which Unlock of a Lock that holds nothing waits for
// before it returns ErrNotHeld without a request.
func settle(t *testing.T, l *lock.Lock) {
	t.Helper()
	if err := l.Unlock(testCtx(t)); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Unlock of a Lock that holds nothing = %v; want ErrNotHeld", err)
	}
}

// A client whose clock runs more than a minute ahead of the store's cannot
// acquire: TryLock and a blocking Lock return at once with the store's
// refusal (sskv.ErrTimestampSkew), sending one request each, and leave no
// key behind.
func TestClockAheadRefusesAcquisition(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := "plain"
		if fence {
			name = "FenceKey"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			c := dialSkewed(t, srv.Addr(), skewOf(2*time.Minute))
			l := newLock(t, c, lock.Config{Name: "l", TTL: clockTTL, FenceKey: fence})

			before, start := srv.Requests(c.ID()), time.Now()
			ok, err := l.TryLock(testCtx(t))
			took := time.Since(start)
			settle(t, l)
			sent := srv.Requests(c.ID()) - before
			t.Logf("TryLock: %v after %v, %d requests", err, took, sent)
			if ok || !errors.Is(err, sskv.ErrTimestampSkew) {
				t.Fatalf("TryLock = %v, %v; want the timestamp skew error", ok, err)
			}
			if !strings.Contains(err.Error(), "clocks are synchronized") {
				t.Errorf("TryLock's error %q does not say to synchronise the clocks", err)
			}
			if took > promptly || sent > 2 {
				t.Errorf("TryLock took %v and %d requests; want one refused request", took, sent)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before, start = srv.Requests(c.ID()), time.Now()
			err = l.Lock(ctx)
			took = time.Since(start)
			settle(t, l)
			sent = srv.Requests(c.ID()) - before
			t.Logf("Lock: %v after %v, %d requests", err, took, sent)
			if !errors.Is(err, sskv.ErrTimestampSkew) {
				t.Fatalf("Lock = %v; want the timestamp skew error", err)
			}
			if took > promptly || sent > 2 {
				t.Errorf("Lock took %v and %d requests; want it to give up after one refused request", took, sent)
			}
			if ctx.Err() != nil {
				t.Errorf("Lock returned when its context ended, not when the store refused")
			}
			if res, err := dial(t, srv.Addr()).Get(testCtx(t), "l"); err != nil || res.Found {
				t.Errorf("key after refused acquisitions: %+v, %v; want none", res, err)
			}
		})
	}
}

// A clock less than a minute ahead is accepted: the skewed holder acquires
// and renews, and the next holder, with an accurate clock, gets a greater
// token although its clock reads 30 s earlier.
func TestClockAheadWithinDrift(t *testing.T) {
	srv := startStore(t)
	hook, waitRenewals := renewals(t)
	a := newLock(t, dialSkewed(t, srv.Addr(), skewOf(30*time.Second)), lock.Config{Name: "l", TTL: clockTTL, OnRenewal: hook})
	b := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: clockTTL})
	mustLock(t, a)
	if wall := time.UnixMilli(a.Token().Wall); time.Until(wall) < 25*time.Second {
		t.Errorf("a's token %v is not ~30 s ahead", a.Token())
	}
	waitRenewals(3)
	if err := a.Err(); err != nil {
		t.Fatalf("the holder 30 s ahead lost the lock: %v", err)
	}
	if err := a.Unlock(testCtx(t)); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	mustLock(t, b)
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
}

// A holder whose clock jumps more than a minute ahead while it holds the
// lock: the store refuses its renewals, and it declares the lock lost by its
// renew deadline, with the store's refusal as the last renewal's error. It
// retries only until then, with backoff, and sends nothing after.
func TestHolderClockJumpsAhead(t *testing.T) {
	srv := startStore(t)
	skew := skewOf(0)
	c := dialSkewed(t, srv.Addr(), skew)
	hook, waitRenewals := renewals(t)
	a := newLock(t, c, lock.Config{Name: "l", TTL: clockTTL, OnRenewal: hook})
	mustLock(t, a)
	waitRenewals(1)

	before, jump := srv.Requests(c.ID()), time.Now()
	skew.Store(int64(2 * time.Minute))
	done := waitDone(t, a)
	sent := srv.Requests(c.ID()) - before
	t.Logf("lost %v after the jump, %d requests; Err = %v", done.Sub(jump), sent, a.Err())
	err := a.Err()
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrRenewDeadline) || !errors.Is(err, sskv.ErrTimestampSkew) {
		t.Fatalf("Err = %v; want ErrLost, ErrRenewDeadline and the timestamp skew", err)
	}
	if rd := a.Config().RenewDeadline; done.Sub(jump) > rd+promptly {
		t.Errorf("lost %v after the jump; want by the renew deadline (%v)", done.Sub(jump), rd)
	}
	if sent > 15 {
		t.Errorf("%d refused renewals before the deadline; want a few, with backoff", sent)
	}
	if _, err := a.FencingToken(); !errors.Is(err, lock.ErrLost) {
		t.Errorf("FencingToken after the loss = %v; want ErrLost", err)
	}

	before = srv.Requests(c.ID())
	time.Sleep(clockTTL) // the span measured, not a wait for an event
	// A retry sent just before the deadline may reach the store after it,
	// on a loaded machine; nothing is sent after.
	if n := srv.Requests(c.ID()) - before; n > 1 {
		t.Errorf("%d requests in a TTL after the lock was lost; want none but one in flight", n)
	}
	// The key, unrenewed, expires: an accurate holder takes it.
	b := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: clockTTL})
	mustLock(t, b)
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
	// The lost holder's Unlock is refused at once (its clock is still
	// ahead), and cannot touch b's key.
	start := time.Now()
	if err := a.Unlock(testCtx(t)); !errors.Is(err, sskv.ErrTimestampSkew) || time.Since(start) > promptly {
		t.Errorf("Unlock of the lost lock = %v after %v; want a prompt timestamp skew error", err, time.Since(start))
	}
	if h := holder(t, b); h.ID != b.HolderID() {
		t.Fatalf("Holder = %+v; want b", h)
	}
}

// The store's clock jumps forward and back within MaxDrift while a holder
// renews. The holder keeps the lock: the store's versions stay monotonic,
// the holder's __ts (pushed ahead by the versions it got before a jump
// back) stays within a minute of the store's clock, and key expiry runs on
// the store's elapsed time, which a jump does not change. The next
// holder's token is greater than every earlier one although the store's
// clock reads 50 s earlier, and a fenced write with the earlier token is
// refused.
func TestStoreClockJumpsWithinMaxDrift(t *testing.T) {
	srv := startStore(t)
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	hook, waitRenewals := renewals(t)
	a := newLock(t, ca, lock.Config{Name: "l", TTL: clockTTL, OnRenewal: hook})
	b := newLock(t, cb, lock.Config{Name: "l", TTL: clockTTL})
	ctx := testCtx(t)
	mustLock(t, a)
	if _, err := ca.Set(ctx, "resource", []byte("a"), sskv.SetOptions{FencingToken: a.Token()}); err != nil {
		t.Fatalf("fenced write with a's token: %v", err)
	}

	srv.SetClockOffset(30 * time.Second)
	waitRenewals(2)
	srv.SetClockOffset(-20 * time.Second) // a step back of 50 s
	waitRenewals(2)
	if err := a.Err(); err != nil {
		t.Fatalf("a lost the lock across the jumps: %v", err)
	}
	if h := holder(t, b); h.ID != a.HolderID() || !h.Version.After(a.Token()) {
		t.Fatalf("Holder = %+v; want a, renewed past its token %v", h, a.Token())
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	mustLock(t, b)
	if !b.Token().After(a.Token()) {
		t.Fatalf("b's token %v is not after a's %v", b.Token(), a.Token())
	}
	if ahead := time.Until(time.UnixMilli(b.Token().Wall)); ahead < 20*time.Second {
		t.Logf("b's token is %v ahead of real time", ahead) // informative: the store's clock is 20 s behind
	}
	if _, err := cb.Set(ctx, "resource", []byte("b"), sskv.SetOptions{FencingToken: b.Token()}); err != nil {
		t.Fatalf("fenced write with b's token: %v", err)
	}
	_, err := ca.Set(ctx, "resource", []byte("a again"), sskv.SetOptions{FencingToken: a.Token()})
	if !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("fenced write with a's token after b's = %v; want ErrFencingTokenLower", err)
	}
	if res, err := cb.Get(ctx, "resource"); err != nil || string(res.Value) != "b" {
		t.Fatalf("resource = %q, %v; want b's", res.Value, err)
	}
}

// The store's clock jumps more than a minute forward: nothing changes for
// the holder (a client never sends a __ts ahead of the store, and does not
// adopt versions more than a minute ahead of its own clock), and tokens
// keep increasing. Then it steps back by more than a minute: the store's
// clock is now ahead of its wall clock by more than MaxDrift, and it
// refuses every request (localstore.MsgClockAhead) until real time catches
// up. The holder loses the lock by its renew deadline, a waiter's Lock
// returns at once with the store's refusal, and nothing hangs.
func TestStoreClockBeyondMaxDrift(t *testing.T) {
	srv := startStore(t)
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	hook, waitRenewals := renewals(t)
	a := newLock(t, ca, lock.Config{Name: "l", TTL: clockTTL, OnRenewal: hook})
	b := newLock(t, cb, lock.Config{Name: "l", TTL: clockTTL})
	ctx := testCtx(t)
	mustLock(t, a)
	first := a.Token()

	srv.SetClockOffset(2 * time.Minute)
	waitRenewals(2)
	if err := a.Err(); err != nil {
		t.Fatalf("a lost the lock when the store's clock jumped forward: %v", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	mustLock(t, a)
	if !a.Token().After(first) || time.Until(time.UnixMilli(a.Token().Wall)) < 100*time.Second {
		t.Fatalf("token after the forward jump %v; want after %v and ~2 min ahead", a.Token(), first)
	}
	waitRenewals(1)

	before, jump := srv.Requests(ca.ID()), time.Now()
	srv.SetClockOffset(0) // a step back of 2 min
	done := waitDone(t, a)
	sent := srv.Requests(ca.ID()) - before
	err := a.Err()
	t.Logf("lost %v after the step back, %d requests; Err = %v", done.Sub(jump), sent, err)
	var se *sskv.ServiceError
	if !errors.Is(err, lock.ErrLost) || !errors.Is(err, lock.ErrRenewDeadline) || !errors.As(err, &se) || se.Message != localstore.MsgClockAhead {
		t.Fatalf("Err = %v; want ErrLost, ErrRenewDeadline and the store's MsgClockAhead", err)
	}
	if rd := a.Config().RenewDeadline; done.Sub(jump) > rd+promptly {
		t.Errorf("lost %v after the step back; want by the renew deadline (%v)", done.Sub(jump), rd)
	}
	if sent > 15 {
		t.Errorf("%d refused renewals before the deadline; want a few, with backoff", sent)
	}

	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before, start := srv.Requests(cb.ID()), time.Now()
	err = b.Lock(wctx)
	took := time.Since(start)
	t.Logf("waiter's Lock: %v after %v, %d requests", err, took, srv.Requests(cb.ID())-before)
	if !errors.As(err, &se) || se.Message != localstore.MsgClockAhead {
		t.Fatalf("Lock = %v; want the store's MsgClockAhead", err)
	}
	if took > promptly || wctx.Err() != nil {
		t.Errorf("Lock took %v; want it to return at once with the refusal", took)
	}
	if _, err := cb.Get(ctx, "l"); !errors.As(err, &se) || se.Message != localstore.MsgClockAhead {
		t.Errorf("GET = %v; want the store's MsgClockAhead", err)
	}
}
