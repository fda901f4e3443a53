package wait

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
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// recheckTTLs is how many TTLs a waiter sleeps after its last attempt, with
// no notification, before it checks the lock anyway (half a TTL more, and up
// to half a TTL at random, so that waiters do not check together): a
// safeguard against a notification lost in a way the client could not
// detect. Reconnects and overflows are detected (the watch delivers a Resync
// event) and checked at once.
const recheckTTLs = 10

func RecheckAfter(ttl time.Duration) time.Duration {
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

// race acquires the lock, sleeping on the key's notifications while someone
// else holds it. When it fails, unknown reports that its last attempt may
// have taken the key, which the caller must then delete. The caller has the
// turn.
//
// No attempt goes out within a TTL of a reconnect of the client, nor within
// a TTL of a Resync of the watch that found the key missing after the waiter
// had seen it held (see lease.HoldOff).
func (w *Waiter) race(ctx context.Context) (unknown bool, err error) {
	l := w.l
	r := racer{c: l.Client(), cfg: *l.Config(), log: l.Log(), l: l, own: true}
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
	cfg lease.Config
	log *slog.Logger
	// l is the Lock attempts go through. Acquire's is nil until an
	// attempt needs one, and again after an attempt that took nothing
	// (one whose outcome is unknown keeps it: its undo list gives the key
	// back). Acquire's Locks have the turn from the start.
	l   *lease.Lease
	own bool // l is the waiting Lock's own (Lock.Lock): its calls are bound
	// ww is the wait's watch of the key, until a holding takes it over
	// (FenceKey: see holding.guard).
	ww lease.KeyWatch
}

// attempt makes one acquisition through cn, as Lease.Attempt, with the
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
			cfg.HolderID = lease.DefaultHolderID(r.c.ID())
			log = lease.Logger(&cfg)
		}
		l = lease.New(r.c, cfg, log)
		_ = l.Begin(context.Background()) // Acquire's own until it returns it: a new Lease's turn is free
		r.l = l
	}
	l.Watch = r.ww
	if handed != nil {
		ok, err = l.AttemptHandedOver(ctx, cn, handed, ft)
	} else {
		ok, err = l.Attempt(ctx, cn)
	}
	r.ww, l.Watch = l.Watch, lease.KeyWatch{}
	unknown = err != nil && l.Unknown() // attempt keeps what may have been written (a late answer too)
	if !ok && !unknown && !r.own {
		r.l = nil
	}
	return ok, unknown, err
}

// handedMe reports whether value is a reservation of the key for this
// waiter, written by a holder's UnlockTo.
func (r *racer) handedMe(value []byte) bool {
	return r.cfg.FenceKey && r.cfg.HolderID != "" && lease.IsReservation(value, r.cfg.HolderID)
}

// reservedOn reports whether a read through cn finds the key reserved for
// this waiter (handed), and the reservation's version: within a hold-off,
// a reservation only heard of may have expired and the key been taken and
// lost since (see Lease.ReservedOn).
func (r *racer) reservedOn(ctx context.Context, cn *sskv.Conn, handed []byte) (hlc.Timestamp, bool) {
	rctx, cancel := r.until(ctx, time.Now().Add(r.cfg.TTL))
	defer cancel()
	res, err := cn.Get(rctx, r.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, handed) {
		return hlc.Timestamp{}, false
	}
	return res.Version, true
}

// until is Lease.Until for a Lock's own wait, and otherwise a child of ctx
// ended at deadline.
func (r *racer) until(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if r.own {
		return r.l.Until(ctx, deadline)
	}
	return context.WithDeadline(ctx, deadline)
}

// wait is Waiter.race, for r.
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
		// The watch's events and the lease.Timers wake the waiter through box.
		box = lease.NewBox()
		ttl = r.cfg.TTL
	)
	// On return the watch ends at once (the client unregisters it in the
	// background, so Lock does not wait for that round trip), unless the
	// holding took it over (FenceKey: see holding.guard).
	defer func() {
		if r.ww.W != nil {
			r.ww.End()
			r.ww = lease.KeyWatch{}
		}
	}()
	defer func() {
		stopTimer(delay)
		stopTimer(hold)
		stopTimer(recheck)
	}()
	recheck = box.Arm(recheck, lease.RecheckTimer, RecheckAfter(ttl))
	// The wait sleeps on box and on the caller's context, which ends ctx
	// too (Close ends ctx, then wakes box).
	parent := ctx
	if r.own {
		parent = r.l.SleepOn(ctx, box)
	}

	retryLater := func() {
		if retry == nil {
			retry = lease.NewBackoff(max(ttl/100, time.Millisecond), max(ttl/4, time.Millisecond))
		}
		delayed = false
		delay = box.Arm(delay, lease.DelayTimer, retry.NextBackOff())
	}
	check := true
	for {
		if check {
			check = false
			cn, err := r.c.Connection(ctx)
			if err != nil {
				return unknown, err
			}
			if until := lease.HoldOff(cn, ttl); until.After(holdUntil) {
				holdUntil = until
			}
			// A reservation for this waiter is taken at once. Within a
			// hold-off, only one a read on cn confirms (see reservedOn).
			var handed []byte
			ft := resv
			if !resv.IsZero() {
				resv = hlc.Timestamp{}
				handed = lease.Reservation(r.cfg.HolderID)
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
				hold = box.Arm(hold, lease.HoldTimer, d)
			} else {
				var ok bool
				ok, unknown, err = r.attempt(ctx, cn, handed, ft)
				recheck = box.Arm(recheck, lease.RecheckTimer, RecheckAfter(ttl))
				switch {
				case ok:
					return false, nil
				case err != nil:
					// The store's refusal (a clock too far ahead, not
					// authorized) would be repeated: give up rather than
					// retry until ctx ends.
					if ctx.Err() != nil || errors.Is(err, lease.ErrAlreadyHeld) || errors.Is(err, sskv.ErrClosed) || lease.Refused(err) {
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
						case errors.Is(kerr, lease.ErrNotALock) || ctx.Err() != nil || errors.Is(kerr, sskv.ErrClosed) || lease.Refused(kerr):
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
					if ctx.Err() != nil || errors.Is(err, sskv.ErrClosed) || lease.Refused(err) {
						return unknown, err
					}
					r.log.Debug("watch failed; retrying", "error", err)
					retryLater()
				} else {
					// Its first event, the key's state now, is in box.
					r.ww = lease.KeyWatch{W: w, Box: box}
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
		case <-box.Wake:
			if err := ctx.Err(); err != nil { // Close
				return unknown, err
			}
		}
		evs, ended, fired := box.Take()
		if fired&lease.DelayTimer != 0 {
			check, woken = true, delayed
		}
		if fired&(lease.RecheckTimer|lease.HoldTimer) != 0 {
			check = true
		}
		if fired&lease.RecheckTimer != 0 {
			known = false // a notification may have been lost unseen
			rechecked = true
		}
		for _, ev := range evs {
			if ev.Initial {
				// The state the watch started from, read as part of its
				// registration: the key may have been deleted since the
				// attempt that found it held.
				if ev.Op == sskv.OpDelete || (r.l != nil && lease.ParseHolder(ev.Value, ev.Version).ID == r.l.Config().HolderID) {
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
				if err := lease.CheckRecord(r.cfg.FenceKey, ev.Value); err != nil {
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
						race = lease.NewBackoff(time.Millisecond, min(ttl/10, 100*time.Millisecond))
					}
					delayed = true
					delay = box.Arm(delay, lease.DelayTimer, race.NextBackOff())
				} else {
					check, woken = true, true
				}
			}
			if ev.Op == sskv.OpSet {
				seenHeld = true // the holder renewing, or a new holder: keep sleeping
				if err := lease.CheckRecord(r.cfg.FenceKey, ev.Value); err != nil {
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
			r.ww.End()
			w, r.ww = nil, lease.KeyWatch{}
			check, known = true, false
		}
	}
}

// watchKey starts a waiter's watch of the key, a callback watch that hands
// its events to box, and returns it; lease.KeyWatch.End ends it (at once: the
// client unregisters it in the background). ctx bounds only the
// registration (sskv.Detached): the wait ends the watch when it
// returns, unless a FenceKey holding takes it over (see holding.guard), and
// then it lasts as long as the holding. So a sleeping waiter's watch costs
// no context of its own.
func (r *racer) watchKey(ctx context.Context, box *lease.Box) (*sskv.Watcher, error) {
	// A lost answer to the KEYNOTIFY must not keep the waiter from checking
	// for the client's RequestTimeout: after a TTL, give up on this watch
	// and check again.
	rctx, cancel := r.until(ctx, time.Now().Add(r.cfg.TTL))
	w, err := r.c.Watch(rctx, r.cfg.Name, sskv.WithCallback(box.Event, box.Done), sskv.Detached())
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

// CheckKey reads the key of a lock of cfg, and returns an error wrapping
// lease.ErrNotALock if it holds something that will never be released to that
// lock (see checkRecord), or the read's error.
func CheckKey(ctx context.Context, c *sskv.Client, cfg *lease.Config) error {
	_, err := readKey(ctx, c, cfg)
	return err
}

// readKey is checkKey, returning what it read too.
func readKey(ctx context.Context, c *sskv.Client, cfg *lease.Config) (sskv.GetResult, error) {
	res, err := c.Get(ctx, cfg.Name)
	if err != nil {
		return res, err
	}
	return res, lease.CheckRecord(cfg.FenceKey, res.Value)
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
func (u *unchanged) see(log *slog.Logger, cfg *lease.Config, res sskv.GetResult, rechecked bool) {
	same := res.Found && u.value != nil && res.Version == u.version && bytes.Equal(res.Value, u.value)
	if same && rechecked && !u.warned {
		u.warned = true
		log.Warn("lock: the key has not changed since the last safeguard check, over 10 TTLs ago: a value set by hand without expiry is never released (delete it to go on); another client's long lease ends when it expires",
			"key", cfg.Name, "value", lease.Quote(res.Value), "version", res.Version)
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
