package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// Attempt sends one acquisition through cn and, when it applies, starts the
// holding, whose writes go out on cn until a reconnect. It reports whether
// the Lock holds the key. The caller has the turn.
//
// With FenceKey it takes two requests: the SET NEX PX that takes the key,
// whose version is the token, then a SET fenced with the token that writes
// it into the key. Until the second is applied, nobody holds the lock: the
// first does not fence the key, so it cannot exclude a delayed request of
// an earlier holding.
func (l *Lease) Attempt(ctx context.Context, cn *sskv.Conn) (bool, error) {
	return l.AttemptFenced(ctx, cn, hlc.Timestamp{})
}

// AttemptFenced is attempt with the SET that takes the key fenced with ft
// (unless zero): the token of the holder that reserved the key for this
// Lock with FenceKey (see package wait's queue.go).
func (l *Lease) AttemptFenced(ctx context.Context, cn *sskv.Conn, ft hlc.Timestamp) (bool, error) {
	return l.attemptWith(ctx, cn, nil, ft)
}

// AttemptHandedOver is attempt for a FenceKey Lock that found the key
// reserved for it by [Lock.UnlockTo]: resv is the reservation exactly as
// it was seen, at version ft. Its first SET (IfEqualOrNotExists, fenced
// with ft) writes resv again, and so applies only if the key still holds
// that reservation, or is free; a newer holding's key (a newer fence) or
// another value refuses it, and the Lock holds nothing.
func (l *Lease) AttemptHandedOver(ctx context.Context, cn *sskv.Conn, resv []byte, ft hlc.Timestamp) (bool, error) {
	return l.attemptWith(ctx, cn, resv, ft)
}

// attemptWith is attemptFenced whose first SET writes first in place of
// the Lock's own acquisition record, unless first is nil.
func (l *Lease) attemptWith(ctx context.Context, cn *sskv.Conn, first []byte, ft hlc.Timestamp) (bool, error) {
	if h := l.holding(); h.live() {
		return false, ErrAlreadyHeld
	}
	if err := l.giveBack(ctx); err != nil {
		return false, err
	}
	val := l.Value()
	rec := l.record(hlc.Timestamp{}, val)
	if first != nil {
		rec = first
	}
	l.undo = []undoDel{{rec: rec}}
	sent := time.Now()
	// An answer after the renew deadline could promise nothing (see below),
	// so waiting longer for it only delays the next attempt: a lost answer
	// would otherwise hold this Lock for the client's RequestTimeout.
	actx, cancel := l.Until(ctx, sent.Add(l.cfg.RenewDeadline))
	res, err := cn.Set(actx, l.cfg.Name, rec, sskv.SetOptions{
		Condition:    sskv.IfEqualOrNotExists,
		Expiry:       l.cfg.TTL,
		FencingToken: ft,
	})
	// Before cancel, which ends actx whatever the answer was.
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		err = fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	cancel()
	switch {
	case errors.Is(err, sskv.ErrNotSent):
		l.undo = nil // not sent, so not executed
		return false, err
	case errors.Is(err, sskv.ErrFencingTokenRequired):
		l.undo = nil
		return false, nil // a holder with FenceKey has the key
	case first != nil && errors.Is(err, sskv.ErrFencingTokenLower):
		l.undo = nil
		return false, nil // a newer holding fenced the key since the reservation
	case Refused(err):
		l.undo = nil // the store answered that it did not apply the SET
		return false, err
	case err != nil:
		return false, err
	case !res.Applied:
		l.undo = nil
		return false, nil
	}
	token, version := res.Version, res.Version
	if l.cfg.FenceKey {
		rec = l.record(token, val)
		l.undo = append(l.undo, undoDel{rec: rec, ft: token})
		fctx, cancel := l.Until(ctx, sent.Add(l.cfg.RenewDeadline))
		fres, err := cn.Set(fctx, l.cfg.Name, rec, sskv.SetOptions{
			Expiry:       l.cfg.TTL,
			FencingToken: token,
		})
		late := err != nil && ctx.Err() == nil && fctx.Err() != nil // before cancel ends fctx
		cancel()
		if late {
			err = ErrAnsweredLate
		}
		if err != nil {
			return false, err
		}
		version = fres.Version
	}
	if time.Since(sent) >= l.cfg.RenewDeadline {
		// The answer came too late to promise anything: the holding would be
		// lost already. The caller gives the key back (or tries again).
		l.log.Warn("acquisition answered after the renew deadline", "after", time.Since(sent))
		return false, ErrAnsweredLate
	}
	l.undo = nil
	h := newHolding(l, token, rec, sent, cn, version)
	var ww KeyWatch
	if l.cfg.FenceKey && l.Watch.W != nil {
		ww = l.Watch // the guard goes on with the waiter's watch
		l.Watch = KeyWatch{}
	}
	l.mu.Lock()
	l.cur = h
	l.mu.Unlock()
	l.log.Info("acquired", "token", token)
	h.start(sent, ww)
	return true, nil
}

// giveBack deletes what an earlier attempt with an unknown outcome may have
// written with FenceKey, before the next attempt: that record is fenced, so
// the next attempt would find the key held (by itself) until it expired.
// An unfenced record needs no such care: the next attempt's SET NEX of the
// same value simply takes it. The caller has the turn.
func (l *Lease) giveBack(ctx context.Context) error {
	if !slices.ContainsFunc(l.undo, func(u undoDel) bool { return !u.ft.IsZero() }) {
		return nil
	}
	for len(l.undo) > 0 {
		u := l.undo[len(l.undo)-1]
		// A lost answer must not hold up the next attempt for the client's
		// RequestTimeout: after a TTL, try again (a repeated VDEL is
		// harmless).
		vctx, cancel := l.Until(ctx, time.Now().Add(l.cfg.TTL))
		_, err := l.c.VDel(vctx, l.cfg.Name, u.rec, sskv.DelOptions{FencingToken: u.ft})
		cancel()
		if err != nil && !errors.Is(err, sskv.ErrFencingTokenRequired) && !errors.Is(err, sskv.ErrFencingTokenLower) {
			return err
		}
		l.undo = l.undo[:len(l.undo)-1]
	}
	return nil
}

func (l *Lease) Value() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.val
}

// Refused reports whether err is the state store's refusal of a request
// (a *sskv.ServiceError): the request was not applied, and the same request
// would be Refused again, e.g. sskv.ErrTimestampSkew when this client's
// clock is more than a minute ahead of the store's, or sskv.ErrNotAuthorized.
// So is the client's refusal to send a request too large for the broker
// (sskv.ErrTooLarge: a Value too large) or a watch of a key too long.
//
// A refusal because of a fencing token (another holder's key) is not one:
// that holder can go, and a waiter waits for it.
func Refused(err error) bool {
	if errors.Is(err, sskv.ErrTooLarge) || errors.Is(err, sskv.ErrKeyTooLong) {
		return true // refused by the client: not sent, and never would be
	}
	var se *sskv.ServiceError
	return errors.As(err, &se) && !errors.Is(err, sskv.ErrFencingTokenLower) && !errors.Is(err, sskv.ErrFencingTokenRequired)
}

// errNoAnswer: an acquisition got no answer within the renew deadline. Its
// outcome is unknown.
var errNoAnswer = errors.New("lock: acquisition not answered within the renew deadline")

// ErrAnsweredLate: an acquisition applied, but its answer came after the
// renew deadline, so the Lock does not count it as held.
var ErrAnsweredLate = errors.New("lock: acquisition answered after the renew deadline")

// AbandonThenEnd deletes the key if it holds this Lock's HolderID, after an
// acquisition whose outcome is unknown or whose answer came too late, and
// then ends the caller's turn. It runs in the background, so that the caller
// returns by its context's deadline; holding the turn until the delete is
// done keeps it ahead of the Lock's next acquisition, which it would
// otherwise undo. It is bounded by the TTL, after which the key would be
// gone anyway.
func (l *Lease) AbandonThenEnd() {
	undo := l.undo
	l.undo = nil
	go func() {
		defer l.End()
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		// The fenced record first: once it is gone, the unfenced one can be
		// deleted without a token.
		for _, u := range slices.Backward(undo) {
			if _, err := l.c.VDel(ctx, l.cfg.Name, u.rec, sskv.DelOptions{FencingToken: u.ft}); err != nil &&
				!errors.Is(err, sskv.ErrFencingTokenRequired) && !errors.Is(err, sskv.ErrFencingTokenLower) {
				l.log.Debug("could not delete the key after an unknown acquisition; it expires after the TTL", "error", err)
			}
		}
	}()
}
