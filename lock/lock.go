package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/lock/internal/wait"
	"github.com/dsslock/dsslock/sskv"
)

// Lock is one holder of a lease on a key of the state store. Create it with
// [New]; acquire with [Lock.TryLock] or [Lock.Lock]; release with
// [Lock.Unlock]. While it holds the key, it renews the lease by itself, and
// [Lock.Done] closes as soon as it can no longer be sure to hold it. It may
// be acquired again after a release or a loss; its methods are safe for
// concurrent use.
type Lock struct {
	ls *lease.Lease // the lease core: acquisitions, holdings, releases
	w  wait.Waiter  // the wait policy: racing, or the queue
}

// New returns a Lock on cfg.Name that acquires it through c; it sends
// nothing. An invalid cfg gives an error wrapping [ErrConfig].
func New(c *sskv.Client, cfg Config) (*Lock, error) {
	if c == nil {
		return nil, configErr("nil sskv.Client")
	}
	cfg, err := cfg.withDefaults(c.ID())
	if err != nil {
		return nil, err
	}
	if err := checkWatchable(c, cfg.Name, cfg.HolderID); err != nil {
		return nil, err
	}
	return newLock(c, cfg, lease.Logger((*lease.Config)(&cfg))), nil
}

// newLock returns a Lock of cfg, valid and with defaults filled in, that
// logs to log.
func newLock(c *sskv.Client, cfg Config, log *slog.Logger) *Lock {
	return lockOf(lease.New(c, lease.Config(cfg), log))
}

// lockOf returns the Lock whose lease core is ls.
func lockOf(ls *lease.Lease) *Lock {
	return &Lock{ls: ls, w: wait.New(ls)}
}

// Name returns the key of the lock.
func (l *Lock) Name() string { return l.ls.Config().Name }

// HolderID returns the id this Lock writes to the key while it holds it.
func (l *Lock) HolderID() string { return l.ls.Config().HolderID }

// Config returns the Lock's configuration, with defaults filled in.
func (l *Lock) Config() Config { return Config(*l.ls.Config()) }

// wrap adds the lock's name, and the operation op if not empty, to err.
func (l *Lock) wrap(op string, err error) error { return lease.Wrap(l.ls.Config().Name, op, err) }

// TryLock makes one attempt to acquire the lock (SET NEX PX) and reports
// whether it did; someone else holding it is not an error. Within a TTL of
// a reconnect of the client it reports false without trying. Errors:
//   - [ErrNotALock]: the key (read when found held) will never be released;
//   - a *sskv.ServiceError (e.g. sskv.ErrTimestampSkew): the store refused;
//   - anything else (a timeout, a lost connection): the outcome is unknown;
//     the Lock holds nothing, and deletes the key if it took it, in the
//     background, before its next acquisition or Close goes ahead.
func (l *Lock) TryLock(ctx context.Context) (bool, error) {
	ok, err := l.tryLock(ctx)
	if ok || err != nil {
		return ok, err
	}
	// Held (or held off): by a holder that releases it, or by something
	// that never will? The read is advice: a lost answer must not hold
	// TryLock up longer than an acquisition's (RenewDeadline).
	rctx, cancel := context.WithTimeout(ctx, l.ls.Config().RenewDeadline)
	defer cancel()
	if err := wait.CheckKey(rctx, l.ls.Client(), l.ls.Config()); errors.Is(err, ErrNotALock) {
		return false, l.wrap("", err)
	} else if err != nil {
		l.ls.Log().Debug("could not read the key held", "error", err)
	}
	return false, nil
}

// tryLock is TryLock without its read of a key found held.
func (l *Lock) tryLock(ctx context.Context) (bool, error) {
	ctx = l.ls.Bind(ctx)
	defer l.ls.Unbind(ctx)
	if err := l.ls.Begin(ctx); err != nil {
		return false, err
	}
	if err := l.ls.Ended(ctx); err != nil {
		// Close (or the caller) ended the call while it waited for the
		// turn: the turn and the end came together.
		l.ls.End()
		return false, l.wrap("", err)
	}
	cn, err := l.ls.Client().Connection(ctx)
	if err != nil {
		l.ls.End()
		return false, l.wrap("", l.ls.ClosedErr(ctx, err))
	}
	if time.Now().Before(l.ls.HoldOff(cn)) {
		// Within a TTL of a reconnect: the key may be held unseen.
		l.ls.End()
		return false, nil
	}
	ok, err := l.ls.Attempt(ctx, cn)
	switch {
	case errors.Is(err, lease.ErrAnsweredLate):
		l.ls.AbandonThenEnd()
		return false, nil
	case err != nil:
		l.ls.AbandonThenEnd()
		return false, l.wrap("", l.ls.ClosedErr(ctx, err))
	}
	l.ls.End()
	return ok, nil
}

// tryLockWatching is tryLock with ww, a watch of the key, for a FenceKey
// holding's guard to go on with; taken reports that the holding took it
// over. It is how a Semaphore's slot is taken with the slot's watch.
func (l *Lock) tryLockWatching(ctx context.Context, ww lease.KeyWatch) (ok, taken bool, err error) {
	l.ls.Watch = ww
	ok, err = l.tryLock(ctx)
	taken = l.ls.Watch.W == nil
	l.ls.Watch = lease.KeyWatch{}
	return ok, taken, err
}

// held reports whether the Lock holds its key now.
func (l *Lock) held() bool { return l.ls.Held() }

// capHold ends the current holding as lost (ErrMaxHold) after d, unless it
// ends before: an RWMutex writer's cap.
func (l *Lock) capHold(d time.Duration) { l.ls.Cap(d) }

// Lock acquires the lock, waiting on notifications as long as ctx allows
// while someone else holds it (see the package documentation for the
// order). When it returns nil, this Lock holds the key, with at least
// RenewDeadline before it could be lost.
//
// Timeouts and lost connections are retried. Errors, with nothing held:
//   - ctx's error (wrapped) if ctx ends first; an attempt whose outcome is
//     unknown is undone as TryLock does;
//   - [ErrClosed] if Close ends the wait;
//   - a *sskv.ServiceError (e.g. sskv.ErrTimestampSkew: this client's clock
//     is more than a minute ahead of the store's): it would be refused again;
//   - [ErrNotALock]: the key will never be released to this Lock.
func (l *Lock) Lock(ctx context.Context) error {
	ctx = l.ls.Bind(ctx)
	defer l.ls.Unbind(ctx)
	if err := l.ls.Begin(ctx); err != nil {
		return err
	}
	if err := l.ls.Ended(ctx); err != nil { // as in tryLock
		l.ls.End()
		return l.wrap("", err)
	}
	if unknown, err := l.w.Wait(ctx); err != nil {
		if unknown {
			l.ls.AbandonThenEnd()
		} else {
			l.ls.End()
		}
		return l.wrap("", l.ls.ClosedErr(ctx, err))
	}
	l.ls.End()
	return nil
}

// Unlock ends the holding (Err is ErrReleased) and deletes the key if it
// still holds this Lock's HolderID (VDEL). Call it once the guarded work
// has returned. Of a lost lock it does the same and returns nil; of a Lock
// not holding, [ErrNotHeld]. With the connection lost it returns at once
// ([ErrNotReleased]); a store error leaves the delete's outcome unknown. A
// key left behind expires within its TTL. With ctx done already, it still
// tries, for at most a second (the TTL if shorter) of its own.
func (l *Lock) Unlock(ctx context.Context) error {
	if err := l.ls.Begin(ctx); err != nil {
		return err
	}
	defer l.ls.End()
	return l.w.Release(ctx, "")
}

// UnlockTo ends the holding (Err is ErrReleased), as Unlock does, and hands
// the lock to the racing waiter whose HolderID is holderID: in place of the
// delete, one SET fenced with the holding's token (so it replaces only this
// holding's own record) writes a reservation for holderID with the TTL.
// Call it once the guarded work has returned. Waiters of other ids see the
// key held and go on sleeping; the named waiter, if it waits, takes the key
// at once (see Config.Race). If it does not, the reservation expires after
// the TTL, and the waiters race for the key as after any expiry. A
// HolderID is never shared by two Locks: the reservation names one waiter.
//
// It needs Config.FenceKey and Config.Race (a queue hands the lock to its
// own first waiter). A holding that ended before (lost) is not handed
// over: the key is deleted as Unlock would, and the error wraps why the
// holding ended. Other errors are Unlock's.
func (l *Lock) UnlockTo(ctx context.Context, holderID string) error {
	switch {
	case !l.ls.Config().FenceKey || !l.ls.Config().Race:
		return l.wrap("unlock to", configErr("UnlockTo needs Config.FenceKey and Config.Race"))
	case holderID == "" || strings.ContainsAny(holderID, "\n"):
		return l.wrap("unlock to", configErr(fmt.Sprintf("invalid holder id %q", holderID)))
	}
	if err := l.ls.Begin(ctx); err != nil {
		return err
	}
	defer l.ls.End()
	return l.w.Release(ctx, holderID)
}

// Close releases the lock if held (as Unlock) and ends a Lock or TryLock in
// progress; later calls fail with [ErrClosed]. It is idempotent.
func (l *Lock) Close(ctx context.Context) error {
	l.ls.EndCalls()
	if err := l.ls.Begin(ctx); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil
		}
		return err
	}
	defer l.ls.End()
	var err error
	if l.ls.Held() {
		err = l.w.Release(ctx, "")
	}
	l.w.Close(ctx)
	l.ls.MarkClosed()
	return err
}

// Done returns a channel that is closed when the current holding ends: the
// lock was lost or released. Before the first acquisition it is closed.
func (l *Lock) Done() <-chan struct{} { return l.ls.Done() }

// Context returns a context that is cancelled when the current holding ends;
// context.Cause of it is Err. Give it to the work the lock guards.
func (l *Lock) Context() context.Context { return l.ls.Context() }

// Err returns nil while the lock is held, and otherwise why the current
// holding ended: an error wrapping ErrLost and its reason, ErrReleased, or
// ErrNotHeld before the first acquisition.
func (l *Lock) Err() error { return l.ls.Err() }

// Token returns the fencing token of the current holding (zero before the
// first), still readable after it ended; use FencingToken for writes.
func (l *Lock) Token() hlc.Timestamp { return l.ls.Token() }

// FencingToken returns the token to fence a write with, or an error if the
// lock is not held now, checking the renew deadline itself: a process
// paused past it learns here, before any write, that the lock is lost.
func (l *Lock) FencingToken() (hlc.Timestamp, error) {
	t, err := l.ls.FencingToken()
	if err != nil {
		return t, l.wrap("", err)
	}
	return t, nil
}

// FencingConn is FencingToken with the connection on which the holding
// last saw its key. After a reconnect or a Resync it first confirms the key
// with a read, and fails if the holding ended. A write sent after that
// connection is lost fails with sskv.ErrNotSent.
func (l *Lock) FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error) {
	t, cn, err := l.ls.FencingConn(ctx)
	if err != nil {
		return t, nil, l.wrap("", err)
	}
	return t, cn, nil
}

// Fenced tells the Lock that a write fenced with token was refused (err)
// for a newer token. If token is the current holding's, the holding ends
// as lost ([ErrFenced]); an earlier holding's changes nothing.
func (l *Lock) Fenced(token hlc.Timestamp, err error) {
	l.ls.Fenced(token, err)
}

// SetValue changes the value this Lock publishes in its key (Config.Value)
// while it holds the lock: one SET fenced with the holding's token, which
// also renews the lease. It needs Config.FenceKey. If another holder has
// taken over, the store refuses it and the holding ends (ErrHeldByOther).
// Errors: [ErrNotHeld] (or why the holding ended) when not holding;
// sskv.ErrTooLarge, with nothing sent and the earlier value kept; anything
// else leaves the outcome unknown, and the next renewal writes the value.
func (l *Lock) SetValue(ctx context.Context, value []byte) error {
	if !l.ls.Config().FenceKey {
		return l.wrap("set value", configErr("SetValue needs Config.FenceKey"))
	}
	if err := l.ls.Begin(ctx); err != nil {
		return err
	}
	defer l.ls.End()
	if err := l.ls.SetValue(ctx, value); err != nil {
		return l.wrap("set value", err)
	}
	return nil
}

// Holder reads who holds the lock now (GET). For a moment during a FenceKey
// acquisition, a late SetValue of an ended holding can show that holding.
func (l *Lock) Holder(ctx context.Context) (Holder, error) {
	res, err := l.ls.Client().Get(ctx, l.ls.Config().Name)
	if err != nil {
		return Holder{}, l.wrap("holder", err)
	}
	return ParseHolder(res.Value, res.Version), nil
}
