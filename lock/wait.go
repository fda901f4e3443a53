package lock

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

func recheckAfter(ttl time.Duration) time.Duration {
	half := max(ttl/2, time.Millisecond)
	return addSat(mulSat(ttl, recheckTTLs), half+rand.N(half))
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
	r := racer{c: l.c, cfg: l.cfg, log: l.log, l: l, own: true}
	return r.wait(ctx)
}

// racer is what a racing wait (racer.wait) acquires the lock for: a Lock
// whose Lock call waits, or, for Acquire, a Lock made for each attempt, so
// that a waiter keeps no Lock while it sleeps.
type racer struct {
	c *sskv.Client
	// cfg is by value: a pointer in r would put Acquire's on the heap. An
	// empty HolderID (Acquire's default) gives each attempt's Lock a new
	// default one.
	cfg Config
	log *slog.Logger
	// l is the Lock attempts go through. Acquire's is nil until an
	// attempt needs one, and again after an attempt that took nothing
	// (one whose outcome is unknown keeps it: its undo list gives the key
	// back). Acquire's Locks have the turn from the start.
	l   *Lock
	own bool // l is the waiting Lock's own (Lock.Lock): its calls are bound
	// ww is the wait's watch of the key, until a holding takes it over
	// (FenceKey: see holding.guard).
	ww waitWatch
}

// attempt makes one acquisition through cn, as Lock.attempt, with the
// wait's watch for the holding to take over. unknown reports that it may
// have taken the key: r.l then deletes it if it did.
//
// With handed (not nil), the key was found reserved for this waiter
// (handed, at version ft: see Lock.UnlockTo), and the attempt takes it
// over as Lock.attemptHandedOver does.
func (r *racer) attempt(ctx context.Context, cn *sskv.Conn, handed []byte, ft hlc.Timestamp) (ok, unknown bool, err error) {
	l := r.l
	if l == nil {
		cfg, log := r.cfg, r.log
		if cfg.HolderID == "" {
			cfg.HolderID = defaultHolderID(r.c.ID())
			log = lockLogger(&cfg)
		}
		l = newLock(r.c, cfg, log)
		l.busy = true // Acquire's own until it returns it
		r.l = l
	}
	l.watch = r.ww
	if handed != nil {
		ok, err = l.attemptHandedOver(ctx, cn, handed, ft)
	} else {
		ok, err = l.attempt(ctx, cn)
	}
	r.ww, l.watch = l.watch, waitWatch{}
	unknown = err != nil && len(l.undo) > 0 // attempt keeps what may have been written (a late answer too)
	if !ok && !unknown && !r.own {
		r.l = nil
	}
	return ok, unknown, err
}

// handedMe reports whether value is a reservation of the key for this
// waiter, written by a holder's UnlockTo.
func (r *racer) handedMe(value []byte) bool {
	return r.cfg.FenceKey && r.cfg.HolderID != "" && isReservation(value, r.cfg.HolderID)
}

// reservedOn reports whether a read through cn finds the key reserved for
// this waiter (handed), and the reservation's version: within a hold-off,
// a reservation only heard of may have expired and the key been taken and
// lost since (see Lock.reservedOn).
func (r *racer) reservedOn(ctx context.Context, cn *sskv.Conn, handed []byte) (hlc.Timestamp, bool) {
	rctx, cancel := r.until(ctx, time.Now().Add(r.cfg.TTL))
	defer cancel()
	res, err := cn.Get(rctx, r.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, handed) {
		return hlc.Timestamp{}, false
	}
	return res.Version, true
}

// until is Lock.until for a Lock's own wait, and otherwise a child of ctx
// ended at deadline.
func (r *racer) until(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if r.own {
		return r.l.until(ctx, deadline)
	}
	return context.WithDeadline(ctx, deadline)
}

// wait is Lock.wait, for r.
func (r *racer) wait(ctx context.Context) (unknown bool, err error) {
	var (
		w         *sskv.Watcher // the watch of the key, also in r.ww until a holding takes it
		woken     bool          // the pending check was woken by a deletion
		lost      bool          // a check woken by a deletion lost the race to another waiter
		delayed   bool          // the delay timer wakes a deletion's check (not a retry)
		seenHeld  bool          // an attempt or the watch found the key held
		known     bool          // the key's value was read since the watch began, or the last recheck (see checkRecord)
		rechecked bool          // the safeguard recheck fired since the last read of the key
		still     unchanged     // the key's value and version at the last read
		holdUntil time.Time     // no attempt before: the key may be held in someone's belief
		unseen    time.Time     // no attempt before, even on a reservation: the key vanished unseen
		resv      hlc.Timestamp // the version of a reservation of the key for this waiter (UnlockTo), if the key holds one
		// Made when first needed: a waiter that sleeps while the holder
		// renews needs only its watch and the recheck timer.
		retry, race *backoff.ExponentialBackOff
		delay, hold *time.Timer
		recheck     *time.Timer // the safeguard recheck (recheckAfter)
		// The watch's events and the timers wake the waiter through box.
		box = newWaitBox()
		ttl = r.cfg.TTL
	)
	// On return the watch ends at once (the client unregisters it in the
	// background, so Lock does not wait for that round trip), unless the
	// holding took it over (FenceKey: see holding.guard).
	defer func() {
		if r.ww.w != nil {
			r.ww.end()
			r.ww = waitWatch{}
		}
	}()
	defer func() {
		stopTimer(delay)
		stopTimer(hold)
		stopTimer(recheck)
	}()
	recheck = box.arm(recheck, recheckTimer, recheckAfter(ttl))
	// The wait sleeps on box and on the caller's context, which ends ctx
	// too (Close ends ctx, then wakes box).
	parent := ctx
	if r.own {
		parent = r.l.sleepOn(ctx, box)
	}

	retryLater := func() {
		if retry == nil {
			retry = newBackoff(max(ttl/100, time.Millisecond), max(ttl/4, time.Millisecond))
		}
		delayed = false
		delay = box.arm(delay, delayTimer, retry.NextBackOff())
	}
	check := true
	for {
		if check {
			check = false
			cn, err := r.c.Connection(ctx)
			if err != nil {
				return unknown, err
			}
			if until := holdOff(cn, ttl); until.After(holdUntil) {
				holdUntil = until
			}
			// A reservation for this waiter is taken at once. Within a
			// hold-off, only one a read on cn confirms (see reservedOn).
			var handed []byte
			ft := resv
			if !resv.IsZero() {
				resv = hlc.Timestamp{}
				handed = reservation(r.cfg.HolderID)
				if time.Now().Before(holdUntil) {
					ok := false
					if !time.Now().Before(unseen) {
						ft, ok = r.reservedOn(ctx, cn, handed)
					}
					if !ok {
						handed = nil
					}
				}
			}
			if d := time.Until(holdUntil); d > 0 && handed == nil {
				// No attempt until then; the watch is set up meanwhile.
				r.log.Debug("the key may still be held by a holder that lost it unseen; waiting", "for", d)
				hold = box.arm(hold, holdTimer, d)
			} else {
				var ok bool
				ok, unknown, err = r.attempt(ctx, cn, handed, ft)
				recheck = box.arm(recheck, recheckTimer, recheckAfter(ttl))
				switch {
				case ok:
					return false, nil
				case err != nil:
					// The store's refusal (a clock too far ahead, not
					// authorized) would be repeated: give up rather than
					// retry until ctx ends.
					if ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || refused(err) {
						return unknown, err
					}
					// A timeout or a lost connection: try again soon. The
					// same value makes a repeat of an applied SET harmless
					// (NEX).
					r.log.Debug("acquisition failed; retrying", "error", err)
					if handed != nil {
						resv = ft // the reservation may still be there: take it again
					}
					retryLater()
				default: // held by someone else
					if retry != nil {
						retry.Reset()
					}
					lost = lost || woken
					seenHeld = true
					if w != nil && !known {
						// Held by a holder that releases it, or by something
						// that never will? Once the watch is on, its
						// notifications show every later value.
						rctx, cancel := r.until(ctx, time.Now().Add(ttl))
						res, kerr := readKey(rctx, r.c, &r.cfg)
						cancel()
						switch {
						case kerr == nil:
							known = true
							still.see(r.log, &r.cfg, res, rechecked)
							rechecked = false
							if r.handedMe(res.Value) {
								resv, check = res.Version, true
							}
						case errors.Is(kerr, ErrNotALock) || ctx.Err() != nil || errors.Is(kerr, sskv.ErrClosed) || refused(kerr):
							return unknown, kerr
						default:
							r.log.Debug("could not read the key held; retrying", "error", kerr)
							retryLater()
						}
					}
				}
				woken = false
			}
			if err == nil && w == nil {
				// Watch the key, then check again: it may have been deleted
				// before the watch was registered.
				if w, err = r.watchKey(ctx, box); err != nil {
					if ctx.Err() != nil || errors.Is(err, sskv.ErrClosed) || refused(err) {
						return unknown, err
					}
					r.log.Debug("watch failed; retrying", "error", err)
					retryLater()
				} else {
					// Its first event, the key's state now, is in box.
					r.ww = waitWatch{w: w, box: box}
					continue
				}
			}
			if check {
				continue // the key was found reserved for this waiter
			}
		}

		select {
		case <-parent.Done():
			return unknown, parent.Err()
		case <-box.wake:
			if err := ctx.Err(); err != nil { // Close
				return unknown, err
			}
		}
		evs, ended, fired := box.take()
		if fired&delayTimer != 0 {
			check, woken = true, delayed
		}
		if fired&(recheckTimer|holdTimer) != 0 {
			check = true
		}
		if fired&recheckTimer != 0 {
			known = false // a notification may have been lost unseen
			rechecked = true
		}
		for _, ev := range evs {
			if ev.Initial {
				// The state the watch started from, read as part of its
				// registration: the key may have been deleted since the
				// attempt that found it held.
				if ev.Op == sskv.OpDelete || (r.l != nil && ParseHolder(ev.Value, ev.Version).ID == r.l.cfg.HolderID) {
					// Free, or its own record: an attempt whose answer
					// was lost applied, or a reservation for it
					// (UnlockTo). Try again now, which takes it over (or
					// gives it back).
					if ev.Op == sskv.OpSet && r.handedMe(ev.Value) {
						resv = ev.Version
					}
					check = true
					continue
				}
				seenHeld, known = true, true
				if err := checkRecord(r.cfg.FenceKey, ev.Value); err != nil {
					return unknown, err // a value that will never be released
				}
				if r.handedMe(ev.Value) {
					resv, check = ev.Version, true
				}
				still.see(r.log, &r.cfg, sskv.GetResult{Value: ev.Value, Version: ev.Version, Found: true}, rechecked)
				rechecked = false
				continue
			}
			if ev.Op == sskv.OpDelete || ev.Resync {
				// Released or expired (or changed while notifications were
				// lost): try at once, or after a short random delay if this
				// waiter lost the last race. A key found missing after the
				// watch lost track of it may have vanished unseen.
				if ev.Resync && ev.Op == sskv.OpDelete && seenHeld {
					if until := time.Now().Add(ttl); until.After(holdUntil) {
						holdUntil = until
					}
					unseen = time.Now().Add(ttl)
				}
				if ev.Op == sskv.OpDelete {
					resv = hlc.Timestamp{}
				}
				if lost {
					if race == nil {
						race = newBackoff(time.Millisecond, min(ttl/10, 100*time.Millisecond))
					}
					delayed = true
					delay = box.arm(delay, delayTimer, race.NextBackOff())
				} else {
					check, woken = true, true
				}
			}
			if ev.Op == sskv.OpSet {
				seenHeld = true // the holder renewing, or a new holder: keep sleeping
				if err := checkRecord(r.cfg.FenceKey, ev.Value); err != nil {
					return unknown, err // a value that will never be released
				}
				resv = hlc.Timestamp{}
				if r.handedMe(ev.Value) {
					// Handed to this waiter (UnlockTo): take it at once.
					resv, check = ev.Version, true
				}
			}
		}
		if ended && w != nil {
			// The watch ended (the service refused to register it again
			// after a reconnect): check, then watch again.
			if ctx.Err() != nil {
				return unknown, ctx.Err()
			}
			r.log.Debug("watch ended; watching again", "error", w.Err())
			r.ww.end()
			w, r.ww = nil, waitWatch{}
			check, known = true, false
		}
	}
}

// watchKey starts a waiter's watch of the key, a callback watch that hands
// its events to box, and returns it; waitWatch.end ends it (at once: the
// client unregisters it in the background). ctx bounds only the
// registration (sskv.Detached): the wait ends the watch when it
// returns, unless a FenceKey holding takes it over (see holding.guard), and
// then it lasts as long as the holding. So a sleeping waiter's watch costs
// no context of its own.
func (r *racer) watchKey(ctx context.Context, box *waitBox) (*sskv.Watcher, error) {
	// A lost answer to the KEYNOTIFY must not keep the waiter from checking
	// for the client's RequestTimeout: after a TTL, give up on this watch
	// and check again.
	rctx, cancel := r.until(ctx, time.Now().Add(r.cfg.TTL))
	w, err := r.c.Watch(rctx, r.cfg.Name, sskv.WithCallback(box.event, box.done), sskv.Detached())
	cancel()
	if err == nil && ctx.Err() != nil {
		go w.Stop()
		err = ctx.Err() // ctx ended as the watch was registered
	}
	if err != nil {
		return nil, err
	}
	return w, nil
}

// checkKey reads the key of a lock of cfg, and returns an error wrapping
// ErrNotALock if it holds something that will never be released to that
// lock (see checkRecord), or the read's error.
func checkKey(ctx context.Context, c *sskv.Client, cfg *Config) error {
	_, err := readKey(ctx, c, cfg)
	return err
}

// readKey is checkKey, returning what it read too.
func readKey(ctx context.Context, c *sskv.Client, cfg *Config) (sskv.GetResult, error) {
	res, err := c.Get(ctx, cfg.Name)
	if err != nil {
		return res, err
	}
	return res, checkRecord(cfg.FenceKey, res.Value)
}

// unchanged notices a key that a waiter finds with the same value at the
// same version at two of its reads a safeguard recheck apart (10 TTLs or
// more): no holder that renews leaves its key so long unchanged. It may be
// another client's lease that is long and not renewed (the SDK's leased
// lock), or a value set by hand without expiry, which is never released
// and which a Lock without FenceKey cannot tell from a holder's name (see
// checkRecord): the waiter says so, once, in a warning.
type unchanged struct {
	value   []byte
	version hlc.Timestamp
	warned  bool
}

// see records a read of the key of a lock of cfg that found res, after a
// recheck if rechecked.
func (u *unchanged) see(log *slog.Logger, cfg *Config, res sskv.GetResult, rechecked bool) {
	same := res.Found && u.value != nil && res.Version == u.version && bytes.Equal(res.Value, u.value)
	if same && rechecked && !u.warned {
		u.warned = true
		log.Warn("lock: the key has not changed since the last safeguard check, over 10 TTLs ago: a value set by hand without expiry is never released (delete it to go on); another client's long lease ends when it expires",
			"key", cfg.Name, "value", quote(res.Value), "version", res.Version)
	}
	if !same {
		u.value, u.version = bytes.Clone(res.Value), res.Version
	}
}

// stopTimer stops t unless it is nil.
func stopTimer(t *time.Timer) {
	if t != nil {
		t.Stop()
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
func (l *Lock) holdOff(cn *sskv.Conn) time.Time { return holdOff(cn, l.cfg.TTL) }

// holdOff is Lock.holdOff for a lock of the given TTL.
func holdOff(cn *sskv.Conn, ttl time.Duration) time.Time {
	if !cn.AfterOutage() {
		return time.Time{}
	}
	return cn.Since().Add(ttl)
}

// reservedOn reports whether a read through cn finds the key reserved for
// this Lock (its acquisition record, written by a holder that handed the
// lock to it), and the reservation's version, which the SET that takes the
// key is fenced with; cn is the connection that SET goes out on.
//
// Such a reservation lets the Lock take the key within its hold-off after
// a reconnect (see holdOff), which guards against taking a key that
// vanished with a store restart while its holder still counts on it. A key
// that holds the reservation has not vanished from the store cn reaches (a
// restart after the read would end cn, and the SET with it). Whoever wrote
// the reservation held the key until then, as a holding that was never
// lost, and so nobody else held it meanwhile, and it has handed the key on
// (a release). Nobody counts on the key but this Lock. A reservation this Lock has only heard of (a
// turn's version) is not enough: it may have expired, and the key been
// taken, and lost with a restart, since.
func (l *Lock) reservedOn(ctx context.Context, cn *sskv.Conn) (hlc.Timestamp, bool) {
	rctx, cancel := l.until(ctx, time.Now().Add(l.cfg.TTL))
	defer cancel()
	res, err := cn.Get(rctx, l.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, l.acqRecord()) {
		return hlc.Timestamp{}, false
	}
	return res.Version, true
}

// waitWatch is a waiter's watch of the key, which a FenceKey holding takes
// over when the wait ends in an acquisition (see holding.guard). The zero
// waitWatch is none. A Lock keeps it by value: a waiter's watch costs no
// allocation beside the watch itself.
type waitWatch struct {
	w      *sskv.Watcher
	cancel context.CancelFunc // ends the watch; nil for one of watchKey's
	box    *waitBox           // where its events go, which a holding's guard takes over
}

// end ends the watch, if any: with cancel, or else (a watch of
// watchKey's) with a Stop in the background, so that the end does not wait
// for the client to unregister it.
func (ww waitWatch) end() {
	switch {
	case ww.cancel != nil:
		ww.cancel()
	case ww.w != nil:
		go ww.w.Stop()
	}
}

// ender returns a function that ends the watch, as end does.
func (ww waitWatch) ender() func() {
	if ww.cancel != nil {
		return ww.cancel
	}
	return func() { go ww.w.Stop() }
}

// retryRequests calls f until it returns nil or an error final says to
// return, waiting between calls on a backoff scaled to ttl (as a waiter
// retries a failed request) and logging each failure with msg. It returns
// ctx's error if ctx ends while it waits.
func retryRequests(ctx context.Context, ttl time.Duration, log *slog.Logger, msg string, f func() error, final func(error) bool) error {
	var retry *backoff.ExponentialBackOff
	for {
		err := f()
		if err == nil || ctx.Err() != nil || final(err) {
			return err
		}
		if retry == nil {
			retry = newBackoff(max(ttl/100, time.Millisecond), max(ttl/4, time.Millisecond))
		}
		log.Debug(msg, "error", err)
		t := time.NewTimer(retry.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
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

// waitQueued acquires the lock as wait does, queueing behind the waiters
// that came first (see queue.go): a thin loop that runs the actions
// qcore.next decides. The caller has the turn.
func (l *Lock) waitQueued(ctx context.Context) (unknown bool, err error) {
	if q := l.q; q == nil || q.over() {
		// Not in the queue: a free lock is taken with one request, as
		// TryLock would.
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
	if !l.holding().live() {
		// A holding that ended without handing the queue over leaves it
		// here: it goes on first, and this Lock waits as the others do.
		q.handOnKept()
	}
	q.startWait()
	acquired := false
	defer func() {
		if q := l.q; q != nil && !acquired {
			q.leave()
			q.release()
		}
	}()

	retry := newBackoff(max(l.cfg.TTL/100, time.Millisecond), max(l.cfg.TTL/4, time.Millisecond))
	retrying := false // a failed request waits for the timer
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	grace := time.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	var graceGen uint64
	recheck := time.NewTimer(recheckAfter(l.cfg.TTL))
	defer recheck.Stop()
	var (
		still     unchanged // the key's value and version at the last join
		rechecked bool      // the safeguard recheck fired since the last join
	)

	fail := func(err error) (bool, error) {
		if ctx.Err() != nil || errors.Is(err, ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || refused(err) {
			return true, err
		}
		l.log.Debug("request failed while waiting; retrying", "error", err)
		retrying = true
		timer.Reset(retry.NextBackOff())
		return false, nil
	}
	// try makes the attempt a decides.
	try := func(a qaction) (done bool, err error) {
		cn, err := l.c.Connection(ctx)
		if err != nil {
			return true, err
		}
		ft, holdUntil := a.ft, q.holdUntil()
		until := holdUntil
		if off := l.holdOff(cn); off.After(until) {
			until = off
		}
		if d := time.Until(until); d > 0 {
			// Only a reconnect holds it off, and the key is reserved for
			// it: a read on cn shows whether it still is (see reservedOn).
			ok := false
			if !ft.IsZero() && !time.Now().Before(holdUntil) {
				ft, ok = l.reservedOn(ctx, cn)
			}
			if !ok {
				if q.heldOff(ctx) {
					l.log.Debug("held off after an outage; the turn goes on to the next waiter", "for", d)
					return false, nil
				}
				l.log.Debug("the key may still be held by a holder that lost it unseen; waiting", "for", d)
				retrying = true
				timer.Reset(d)
				q.attempted(a, true)
				return false, nil
			}
		}
		var kw waitWatch
		if l.cfg.FenceKey {
			// The holding's guard goes on with the watch of the key.
			if kw = q.takeKeyWatch(); kw.w != nil {
				l.watch = kw
			}
		}
		ok, err := l.attemptFenced(ctx, cn, ft)
		if l.watch.w != nil {
			l.watch = waitWatch{} // not taken over: the attempt failed
			q.giveKeyWatch(kw)
		}
		unknown = err != nil && len(l.undo) > 0
		recheck.Reset(recheckAfter(l.cfg.TTL))
		switch {
		case ok:
			acquired = true
			q.acquired(a.partial, l.holding().token)
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
			if l.q == q {
				l.q = nil
			}
			if q, err = l.engage(ctx); err != nil {
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
				if _, err := l.c.Set(ctx, l.inbox(a.to), append([]byte{msgRejoin}, l.acqRecord()...), l.msgOptions()); err != nil {
					q.joinFailed()
					if stop, err := fail(err); stop {
						return unknown, err
					}
				}
				continue
			case actGet:
				// Find the holder, and join it. A lost answer costs at
				// most a TTL, as a racing waiter's read does.
				rctx, cancel := l.until(ctx, time.Now().Add(l.cfg.TTL))
				res, err := l.c.Get(rctx, l.cfg.Name)
				cancel()
				if err != nil {
					if stop, err := fail(err); stop {
						return unknown, err
					}
					continue
				}
				if err := checkRecord(l.cfg.FenceKey, res.Value); err != nil {
					// It will never be released: waiting would last forever.
					return unknown, err
				}
				still.see(l.log, &l.cfg, res, rechecked)
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
					if _, err := l.c.Set(ctx, l.inbox(a.to), append([]byte{msgJoin}, l.acqRecord()...), l.msgOptions()); err != nil {
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
			recheck.Reset(recheckAfter(l.cfg.TTL))
		}
	}
}
