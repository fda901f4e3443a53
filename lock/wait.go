package lock

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// recheckTTLs is how many TTLs a waiter sleeps after its last attempt, with
// no notification, before it checks the lock anyway (half a TTL more, and up
// to half a TTL at random, so that waiters do not check together): a
// safeguard against a notification lost in a way the client could not
// detect. Reconnects and overflows are detected (the watch delivers a Resync
// event) and checked at once.
const recheckTTLs = 10

func (l *Lock) recheckAfter() time.Duration {
	half := max(l.cfg.TTL/2, time.Millisecond)
	return addSat(mulSat(l.cfg.TTL, recheckTTLs), half+rand.N(half))
}

// mulSat is d*n, or the longest Duration if that overflows.
func mulSat(d time.Duration, n int64) time.Duration {
	if d > math.MaxInt64/time.Duration(n) {
		return math.MaxInt64
	}
	return d * time.Duration(n)
}

// addSat is a+b for positive durations, or the longest Duration if that
// overflows.
func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// wait acquires the lock, sleeping on the key's notifications while someone
// else holds it. When it fails, unknown reports that its last attempt may
// have taken the key, which the caller must then delete. The caller has the
// turn.
//
// No attempt goes out within a TTL of a reconnect of the client, nor within
// a TTL of a Resync of the watch that found the key missing after the waiter
// had seen it held (see holdOff).
func (l *Lock) wait(ctx context.Context) (unknown bool, err error) {
	var (
		w         *sskv.Watcher
		wcancel   context.CancelFunc = func() {}
		woken     bool               // the pending check was woken by a deletion
		lost      bool               // a check woken by a deletion lost the race to another waiter
		delayed   bool               // the delay timer wakes a deletion's check (not a retry)
		seenHeld  bool               // an attempt or the watch found the key held
		holdUntil time.Time          // no attempt before: the key may be held in someone's belief
	)
	// On return the watch ends at once (the client unregisters it in the
	// background, so Lock does not wait for that round trip), unless the
	// holding took it over (FenceKey: see holding.guard).
	defer func() {
		if l.watch != nil {
			wcancel()
			l.watch = nil
		}
	}()

	retry := newBackoff(max(l.cfg.TTL/100, time.Millisecond), max(l.cfg.TTL/4, time.Millisecond))
	race := newBackoff(time.Millisecond, min(l.cfg.TTL/10, 100*time.Millisecond))
	delay := time.NewTimer(time.Hour)
	delay.Stop()
	defer delay.Stop()
	recheck := time.NewTimer(l.recheckAfter())
	defer recheck.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	holdFrom := func(from time.Time) {
		if until := from.Add(l.cfg.TTL); until.After(holdUntil) {
			holdUntil = until
		}
	}

	giveUp := func(err error) (bool, error) { return unknown, err }
	retryLater := func() {
		delayed = false
		delay.Reset(retry.NextBackOff())
	}
	check := true
	for {
		if check {
			check = false
			cn, err := l.c.Connection(ctx)
			if err != nil {
				return giveUp(err)
			}
			if until := l.holdOff(cn); until.After(holdUntil) {
				holdUntil = until
			}
			if d := time.Until(holdUntil); d > 0 {
				// No attempt until then; the watch is set up meanwhile.
				l.log.Debug("the key may still be held by a holder that lost it unseen; waiting", "for", d)
				hold.Reset(d)
			} else {
				var ok bool
				ok, err = l.attempt(ctx, cn)
				unknown = err != nil && len(l.undo) > 0 // attempt keeps what may have been written (a late answer too)
				recheck.Reset(l.recheckAfter())
				switch {
				case ok:
					return false, nil
				case err != nil:
					// The store's refusal (a clock too far ahead, not
					// authorized) would be repeated: give up rather than
					// retry until ctx ends.
					if ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || refused(err) {
						return giveUp(err)
					}
					// A timeout or a lost connection: try again soon. The
					// same value makes a repeat of an applied SET harmless
					// (NEX).
					l.log.Debug("acquisition failed; retrying", "error", err)
					retryLater()
				default: // held by someone else
					retry.Reset()
					lost = lost || woken
					seenHeld = true
				}
				woken = false
			}
			if err == nil && w == nil {
				// Watch the key, then check again: it may have been deleted
				// before the watch was registered.
				// The watch ends with ctx while waiting, and may outlive it
				// once the holding has taken it over.
				wctx, cancelW := context.WithCancel(context.WithoutCancel(ctx))
				stopOnCtx := context.AfterFunc(ctx, cancelW)
				cancel := func() { stopOnCtx(); cancelW() }
				// A lost answer to the KEYNOTIFY must not keep the waiter
				// from checking for the client's RequestTimeout: after a
				// TTL, give up on this watch and check again.
				slow := time.AfterFunc(l.cfg.TTL, cancelW)
				w, err = l.c.Watch(wctx, l.cfg.Name)
				slow.Stop() // if it fired after Watch returned, the watch ends and is set up again
				if err != nil {
					cancel()
					w = nil
					if ctx.Err() != nil || errors.Is(err, sskv.ErrClosed) || refused(err) {
						return giveUp(err)
					}
					l.log.Debug("watch failed; retrying", "error", err)
					retryLater()
				} else {
					wcancel = cancel
					l.watch = &waitWatch{w: w, cancel: cancelW, detach: stopOnCtx}
					check = true
					continue
				}
			}
		}

		var events <-chan sskv.Event
		if w != nil {
			events = w.Events()
		}
		select {
		case <-ctx.Done():
			return giveUp(ctx.Err())
		case ev, ok := <-events:
			switch {
			case !ok:
				// The watch ended (the service refused to register it again
				// after a reconnect): check, then watch again.
				if ctx.Err() != nil {
					return giveUp(ctx.Err())
				}
				l.log.Debug("watch ended; watching again", "error", w.Err())
				wcancel()
				w, wcancel, l.watch = nil, func() {}, nil
				check = true
			case ev.Op == sskv.OpDelete || ev.Resync:
				// Released or expired (or changed while notifications were
				// lost): try at once, or after a short random delay if this
				// waiter lost the last race. A key found missing after the
				// watch lost track of it may have vanished unseen.
				if ev.Resync && ev.Op == sskv.OpDelete && seenHeld {
					holdFrom(time.Now())
				}
				if lost {
					delayed = true
					delay.Reset(race.NextBackOff())
				} else {
					check, woken = true, true
				}
			}
			if ev.Op == sskv.OpSet {
				seenHeld = true // the holder renewing, or a new holder: keep sleeping
			}
		case <-delay.C:
			check, woken = true, delayed
		case <-recheck.C:
			check = true
		case <-hold.C:
			check = true
		}
	}
}

// holdOff returns when an acquisition through cn may take a missing key:
// a TTL after cn came up if the client was cut off from the store before it
// (a reconnection, or a first connection that came after failed attempts),
// else at once.
//
// The store may have restarted, and lost the key, while the client was cut
// off, at any moment before cn came up: the key's holder, cut off from the
// store or not yet reconnected, still counts on the key until its renew
// deadline, which passes within a TTL of its last renewal on its own clock.
// Before then, nobody may take the key: not a waiter of this Lock, whatever
// it saw, nor a new Lock or Campaign of the same process, which could not
// know what an earlier one saw, nor a process that started while the store
// was down. A process that connects at once has seen nothing, and cannot
// tell a restart just before from none.
func (l *Lock) holdOff(cn *sskv.Conn) time.Time {
	if !cn.AfterOutage() {
		return time.Time{}
	}
	return cn.Since().Add(l.cfg.TTL)
}

// waitWatch is a waiter's watch of the key, which a FenceKey holding takes
// over when the wait ends in an acquisition (see holding.guard).
type waitWatch struct {
	w      *sskv.Watcher
	cancel context.CancelFunc // ends the watch
	detach func() bool        // unties it from the wait's ctx; false if ctx has ended
}

func newBackoff(initial, maxD time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = max(maxD, initial)
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// queueGrace is how long a queued waiter lets each live waiter ahead of it
// in its log take a lock that was freed without a handover (its holder
// crashed, or did not know the queue) before it tries itself.
func (l *Lock) queueGrace() time.Duration {
	return min(max(l.cfg.TTL/50, 20*time.Millisecond), l.cfg.TTL)
}

// maxGraces bounds how many graces a waiter lets pass before it tries a
// lock freed without a handover.
const maxGraces = 4

// waitQueued acquires the lock as wait does, queueing behind the waiters
// that came first (see queue.go). The caller has the turn.
func (l *Lock) waitQueued(ctx context.Context) (unknown bool, err error) {
	if q := l.q; q == nil || q.over() {
		// Not watching the queue: a free lock is taken with one request,
		// as TryLock would.
		cn, err := l.c.Connection(ctx)
		if err != nil {
			return false, err
		}
		if time.Now().After(l.holdOff(cn)) {
			ok, err := l.attempt(ctx, cn)
			unknown = err != nil && len(l.undo) > 0
			switch {
			case ok:
				return false, nil
			case err != nil && (ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || refused(err)):
				return unknown, err
			}
		}
	}
	q, err := l.engage(ctx)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, sskv.ErrClosed) || refused(err) {
			return unknown, err
		}
		l.log.Debug("cannot watch the queue; racing for the lock instead", "error", err)
		u, err := l.wait(ctx)
		return unknown || u, err
	}
	acquired := false
	defer func() {
		if q := l.q; q != nil {
			if acquired {
				q.acquired() // held until the holding's release
			} else {
				// A waiter that gave up leaves no watch behind.
				q.leave()
				q.cancel()
				l.q = nil
			}
		}
	}()

	retry := newBackoff(max(l.cfg.TTL/100, time.Millisecond), max(l.cfg.TTL/4, time.Millisecond))
	var (
		holdUntil time.Time
		tried     bool // the first attempt (the lock may be free) was made
		fresh     = true
		retrying  bool // a failed request, or an attempt held off, waits for the timer
		retryTry  bool // what waits is an attempt: make it when the timer fires
		graced    bool // the grace timer fired since the key was freed
	)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	graceSet := false
	recheck := time.NewTimer(l.recheckAfter())
	defer recheck.Stop()

	fail := func(err error) (bool, error) {
		if ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || refused(err) {
			return true, err
		}
		l.log.Debug("request failed while waiting; retrying", "error", err)
		retrying = true
		timer.Reset(retry.NextBackOff())
		return false, nil
	}
	for {
		st := q.state()
		if st.ended {
			// The watches ended (the service refused them after a
			// reconnect): set them up again.
			if l.q == q {
				l.q = nil
			}
			if q, err = l.engage(ctx); err != nil {
				return false, err
			}
			continue
		}
		if st.changed {
			fresh = true
			if !st.free {
				graced, graceSet = false, false
				grace.Stop()
			}
		}
		try := false
		switch {
		case retrying:
		case retryTry:
			retryTry, try = false, true
		case st.reserved && fresh:
			try = true
		case !tried && st.ahead == 0:
			tried, try = true, true
		case !st.queued || st.rejoin:
			tried = true
			if err := q.join(ctx); err != nil {
				if stop, err := fail(err); stop {
					return false, err
				}
				continue
			}
			retry.Reset()
			continue
		case st.free && fresh && (st.ahead == 0 || graced):
			try = true
		case st.free && !graceSet:
			graceSet = true
			// At most a few graces: the log of a waiter far back may still
			// count waiters that are gone (their service or leave was
			// coalesced into a Resync), and the first waiter, if it is
			// there, has taken the key long before.
			grace.Reset(time.Duration(min(st.ahead, maxGraces)) * l.queueGrace())
		}
		if try {
			fresh = false
			cn, err := l.c.Connection(ctx)
			if err != nil {
				return false, err
			}
			if until := l.holdOff(cn); until.After(holdUntil) {
				holdUntil = until
			}
			if !st.unseen.IsZero() && st.unseen.Add(l.cfg.TTL).After(holdUntil) {
				holdUntil = st.unseen.Add(l.cfg.TTL)
			}
			if !st.unseen.IsZero() && st.unseen.Add(l.cfg.TTL).After(holdUntil) {
				holdUntil = st.unseen.Add(l.cfg.TTL)
			}
			if d := time.Until(holdUntil); d > 0 {
				l.log.Debug("the key may still be held by a holder that lost it unseen; waiting", "for", d)
				retrying, retryTry = true, true
				timer.Reset(d)
				continue
			}
			ft := hlc.Timestamp{}
			if st.reserved && l.cfg.FenceKey {
				ft = st.token
			}
			ok, err := l.attemptFenced(ctx, cn, ft)
			unknown = err != nil && len(l.undo) > 0
			recheck.Reset(l.recheckAfter())
			switch {
			case ok:
				acquired = true
				return false, nil
			case err != nil:
				if stop, err := fail(err); stop {
					return unknown, err
				}
				retryTry = true
			default:
				retry.Reset()
				q.sawHeld()
			}
			continue
		}
		select {
		case <-ctx.Done():
			return unknown, ctx.Err()
		case <-q.sig:
		case <-timer.C:
			retrying, fresh = false, true
		case <-grace.C:
			graced, fresh = true, true
		case <-recheck.C:
			// The safeguard: try anyway, whatever the log says, so that
			// a log gone wrong cannot keep this waiter from a free lock.
			fresh, retryTry = true, true
		}
	}
}
