package wait

import (
	"context"
	"errors"
	"time"

	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// queued acquires the lock as race does, queueing behind the waiters
// that came first (see queue.go): a thin loop that runs the actions
// qcore.next decides. The caller has the turn.
func (w *Waiter) queued(ctx context.Context) (unknown bool, err error) {
	l := w.l
	if q := w.q; q == nil || q.over() {
		// Not in the queue: a free lock is taken with one request, as
		// TryLock would.
		cn, err := l.Client().Connection(ctx)
		if err != nil {
			return false, err
		}
		if time.Now().After(l.HoldOff(cn)) {
			ok, err := l.Attempt(ctx, cn)
			unknown = err != nil && l.Unknown()
			switch {
			case ok:
				return false, nil
			case err != nil && (ctx.Err() != nil || errors.Is(err, lease.ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || lease.Refused(err)):
				return unknown, err
			}
		}
	}
	q, err := w.engage(ctx)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, sskv.ErrClosed) || lease.Refused(err) {
			return unknown, err
		}
		l.Log().Debug("cannot watch the queue; racing for the lock instead", "error", err)
		u, err := w.race(ctx)
		return unknown || u, err
	}
	if !l.Held() {
		// A holding that ended without handing the queue over leaves it
		// here: it goes on first, and this Lock waits as the others do.
		q.handOnKept()
	}
	q.startWait()
	acquired := false
	defer func() {
		if q := w.q; q != nil && !acquired {
			q.leave()
			q.release()
		}
	}()

	retry := lease.NewBackoff(max(l.Config().TTL/100, time.Millisecond), max(l.Config().TTL/4, time.Millisecond))
	retrying := false // a failed request waits for the timer
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	var graceGen uint64
	recheck := time.NewTimer(RecheckAfter(l.Config().TTL))
	defer recheck.Stop()
	var (
		still     unchanged // the key's value and version at the last join
		rechecked bool      // the safeguard recheck fired since the last join
	)

	fail := func(err error) (bool, error) {
		if ctx.Err() != nil || errors.Is(err, lease.ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || lease.Refused(err) {
			return true, err
		}
		l.Log().Debug("request failed while waiting; retrying", "error", err)
		retrying = true
		timer.Reset(retry.NextBackOff())
		return false, nil
	}
	// try makes the attempt a decides.
	try := func(a qaction) (done bool, err error) {
		cn, err := l.Client().Connection(ctx)
		if err != nil {
			return true, err
		}
		ft, holdUntil := a.ft, q.holdUntil()
		until := holdUntil
		if off := l.HoldOff(cn); off.After(until) {
			until = off
		}
		if d := time.Until(until); d > 0 {
			// Only a reconnect holds it off, and the key is reserved for
			// it: a read on cn shows whether it still is (see reservedOn).
			ok := false
			if !ft.IsZero() && !time.Now().Before(holdUntil) {
				ft, ok = l.ReservedOn(ctx, cn)
			}
			if !ok {
				if q.heldOff(ctx) {
					l.Log().Debug("held off after an outage; the turn goes on to the next waiter", "for", d)
					return false, nil
				}
				l.Log().Debug("the key may still be held by a holder that lost it unseen; waiting", "for", d)
				retrying = true
				timer.Reset(d)
				q.attempted(a, true)
				return false, nil
			}
		}
		var kw lease.KeyWatch
		if l.Config().FenceKey {
			// The holding's guard goes on with the watch of the key.
			if kw = q.takeKeyWatch(); kw.W != nil {
				l.Watch = kw
			}
		}
		ok, err := l.AttemptFenced(ctx, cn, ft)
		if l.Watch.W != nil {
			l.Watch = lease.KeyWatch{} // not taken over: the attempt failed
			q.giveKeyWatch(kw)
		}
		unknown = err != nil && l.Unknown()
		recheck.Reset(RecheckAfter(l.Config().TTL))
		switch {
		case ok:
			acquired = true
			q.acquired(a.partial, l.Token())
			return true, nil
		case err != nil:
			if stop, err := fail(err); stop {
				return true, err
			}
		default:
			retry.Reset()
		}
		q.attempted(a, err != nil)
		return false, nil
	}
	for {
		if q.over() {
			// The watches ended (the service refused them after a
			// reconnect): set them up again, and join again.
			if w.q == q {
				w.q = nil
			}
			if q, err = w.engage(ctx); err != nil {
				return unknown, err
			}
			q.startWait()
			continue
		}
		if !retrying {
			switch a := q.next(); a.kind {
			case actEnded:
				continue
			case actWatch:
				if err := q.watchKey(ctx); err != nil {
					if stop, err := fail(err); stop {
						return unknown, err
					}
				}
				continue
			case actUnwatch:
				q.unwatchKey()
				continue
			case actGrace:
				graceGen = a.gen
				grace.Reset(a.d)
			case actAttempt:
				if done, err := try(a); done {
					return unknown, err
				}
				continue
			case actRejoin:
				// Locking again after handing the lock over: join the
				// Lock it went to, which keeps the queue.
				if err := q.leaveWritten(ctx); err != nil {
					return unknown, err
				}
				if _, err := l.Client().Set(ctx, inbox(l.Config(), a.to), append([]byte{msgRejoin}, l.AcqRecord()...), msgOptions(l.Config())); err != nil {
					q.joinFailed()
					if stop, err := fail(err); stop {
						return unknown, err
					}
				}
				continue
			case actGet:
				// Find the holder, and join it. A lost answer costs at
				// most a TTL, as a racing waiter's read does.
				rctx, cancel := l.Until(ctx, time.Now().Add(l.Config().TTL))
				res, err := l.Client().Get(rctx, l.Config().Name)
				cancel()
				if err != nil {
					if stop, err := fail(err); stop {
						return unknown, err
					}
					continue
				}
				if err := lease.CheckRecord(l.Config().FenceKey, res.Value); err != nil {
					// It will never be released: waiting would last forever.
					return unknown, err
				}
				still.see(l.Log(), l.Config(), res, rechecked)
				rechecked = false
				switch a := q.got(res); a.kind {
				case actAttempt:
					if done, err := try(a); done {
						return unknown, err
					}
				case actJoin:
					if err := q.leaveWritten(ctx); err != nil {
						return unknown, err
					}
					if _, err := l.Client().Set(ctx, inbox(l.Config(), a.to), append([]byte{msgJoin}, l.AcqRecord()...), msgOptions(l.Config())); err != nil {
						q.joinFailed()
						if stop, err := fail(err); stop {
							return unknown, err
						}
					}
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return unknown, ctx.Err()
		case <-q.sig:
		case <-timer.C:
			retrying = false
		case <-grace.C:
			q.step(qevent{kind: evGrace, gen: graceGen})
		case <-recheck.C:
			// The safeguard: look at the lock again and join again, so
			// that a lost message cannot keep this waiter forever.
			q.step(qevent{kind: evRecheck})
			rechecked = true
			recheck.Reset(RecheckAfter(l.Config().TTL))
		}
	}
}
