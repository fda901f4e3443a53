package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// Lease is a lock's lease core: one holder's acquisitions, holdings and
// releases of a key, and the turn that orders them. lock.Lock is a Lease
// with a wait policy (package wait) in front.
type Lease struct {
	c   *sskv.Client
	cfg Config
	log *slog.Logger

	// calls runs OnRenewal off the renewer; made at the first renewal
	// that reports to it (see callbacks).
	calls atomic.Pointer[callbacks]
	nonce nonce // makes the record of an acquisition under way this Lock's own
	// undo lists the deletes that give the key back after an acquisition
	// whose outcome is unknown. Guarded by the turn.
	undo []undoDel
	// Watch is the Watch of a wait under way, if any (w is nil if none).
	// Guarded by the turn.
	Watch KeyWatch

	mu  sync.Mutex
	cur *holding // the latest holding; never nil (see notHeld)
	val []byte   // the value published (FenceKey)
	// bound are the contexts of the TryLock and Lock calls in progress,
	// which Close ends (with cause ErrClosed): a wait in progress holds
	// the turn Close needs. A list rather than a context of the Lock's
	// that theirs would hang on: that costs every waiting Lock a few
	// hundred bytes more.
	bound   []boundCall
	closing bool // Close has started
	closed  bool
	// busy: an acquisition or release runs (it has the turn: see begin).
	// Those waiting for the turn wait for turnFree, made only then: a
	// Lock's calls seldom overlap.
	busy     bool
	turnFree chan struct{}
}

// undoDel is a VDEL that gives the key back if it still holds rec.
type undoDel struct {
	rec []byte
	ft  hlc.Timestamp
}

// New returns the Lease of cfg, valid and with defaults filled in, that
// acquires through c and logs to log.
func New(c *sskv.Client, cfg Config, log *slog.Logger) *Lease {
	return &Lease{
		c:     c,
		cfg:   cfg,
		log:   log,
		val:   bytes.Clone(cfg.Value),
		nonce: newNonce(),
		cur:   notHeld,
	}
}

// boundCall is a call's context that Close ends, and what ends it.
type boundCall struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	parent context.Context    // the caller's context, which ctx was made of
	sub    context.CancelFunc // ends the context until made of parent, while it is in use
	box    *Box               // a racing wait's, which sleeps on parent and box, not on ctx (see sleepOn)
}

// Bind returns ctx, also ended by Close (with cause ErrClosed); unbind
// releases it.
func (l *Lease) Bind(ctx context.Context) context.Context {
	bctx, cancel := context.WithCancelCause(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		cancel(ErrClosed)
	} else {
		l.bound = append(l.bound, boundCall{ctx: bctx, cancel: cancel, parent: ctx})
	}
	return bctx
}

// Until returns a context of the call whose context (from bind) is ctx,
// ended also at deadline, and the function that releases it. It is made
// of the caller's context rather than of ctx, and Close ends it after ctx:
// a child of ctx would leave ctx the map of its children (a few hundred
// bytes) for as long as the call lasts, a waiter's as long as it sleeps.
// For a context bind did not return, or while the call has another in
// use, it is a child of ctx.
func (l *Lease) Until(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	l.mu.Lock()
	i := slices.IndexFunc(l.bound, func(b boundCall) bool { return b.ctx == ctx })
	if i < 0 || l.bound[i].sub != nil {
		l.mu.Unlock()
		return context.WithDeadline(ctx, deadline)
	}
	sctx, cancel := context.WithDeadline(l.bound[i].parent, deadline)
	l.bound[i].sub = cancel
	l.mu.Unlock()
	if ctx.Err() != nil { // ended before it was in the list: Close, say
		cancel()
	}
	return sctx, func() {
		cancel()
		l.mu.Lock()
		if i := slices.IndexFunc(l.bound, func(b boundCall) bool { return b.ctx == ctx }); i >= 0 {
			l.bound[i].sub = nil
		}
		l.mu.Unlock()
	}
}

// Unbind releases a context bind returned. The list is let go once it is
// empty: a Lock that holds, or sits idle, keeps no room for calls.
func (l *Lease) Unbind(ctx context.Context) {
	l.mu.Lock()
	var cancel context.CancelCauseFunc
	if i := slices.IndexFunc(l.bound, func(b boundCall) bool { return b.ctx == ctx }); i >= 0 {
		cancel = l.bound[i].cancel
		l.bound = slices.Delete(l.bound, i, i+1)
		if len(l.bound) == 0 {
			l.bound = nil
		}
	}
	l.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
}

// EndCalls ends the TryLock and Lock calls in progress, and those to come,
// with cause ErrClosed.
func (l *Lease) EndCalls() {
	l.mu.Lock()
	l.closing = true
	bound := l.bound
	l.bound = nil
	l.mu.Unlock()
	for _, b := range bound {
		b.cancel(ErrClosed)
	}
	// After the calls' own contexts: a call that finds its context from
	// until ended, or is woken, sees its own ended too.
	for _, b := range bound {
		if b.sub != nil {
			b.sub()
		}
		if b.box != nil {
			b.box.Poke()
		}
	}
}

// SleepOn returns what a racing wait whose context (from bind) is ctx
// sleeps on besides box: the caller's context, which ends ctx, and not ctx
// itself. A context's Done channel is made when first asked for, and ctx's
// would cost each sleeping waiter one; Close wakes the wait through box
// instead, after it has ended ctx. For a context bind did not return, it
// is ctx.
func (l *Lease) SleepOn(ctx context.Context, box *Box) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.bound, func(b boundCall) bool { return b.ctx == ctx })
	if i < 0 {
		return ctx
	}
	l.bound[i].box = box
	return l.bound[i].parent
}

// ClosedErr is ErrClosed in place of err when Close ended ctx.
func (l *Lease) ClosedErr(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), ErrClosed) && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (%w)", ErrClosed, err)
	}
	return err
}

// handoverTag is the token part of the reservation [Lock.UnlockTo] writes,
// an acquisition record (see ParseHolder): nobody holds the lock while it
// is in the key.
const handoverTag = "~handover"

// Reservation returns the record by which UnlockTo reserves the key for
// holderID.
func Reservation(holderID string) []byte {
	return []byte(holderID + "\n" + handoverTag + "\n")
}

// IsReservation reports whether value is reservation(holderID), without
// making it: a waiter checks each notification of the key.
func IsReservation(value []byte, holderID string) bool {
	n := len(holderID)
	return len(value) == n+len(handoverTag)+2 && string(value[:n]) == holderID && value[n] == '\n' &&
		string(value[n+1:len(value)-1]) == handoverTag && value[len(value)-1] == '\n'
}

// Begin takes the Lock's turn for an acquisition or release.
func (l *Lease) Begin(ctx context.Context) error {
	l.mu.Lock()
	for {
		if l.closed { // whatever ctx says
			l.mu.Unlock()
			return l.Wrap("", ErrClosed)
		}
		if !l.busy {
			l.busy = true
			l.mu.Unlock()
			return nil
		}
		if l.turnFree == nil {
			l.turnFree = make(chan struct{})
		}
		free := l.turnFree
		l.mu.Unlock()
		select {
		case <-free:
		case <-ctx.Done():
			return l.Wrap("", l.ClosedErr(ctx, ctx.Err()))
		}
		l.mu.Lock()
	}
}

// WithTurn runs f with the Lock's turn, so that f is ordered with the
// Lock's own acquisitions, waiting for the turn as long as ctx allows; f
// does not run if ctx ends first. On a closed Lock, which acquires nothing
// more, f runs without the turn.
//
// A give-back of a key reserved for this Lock (a VDEL of its acquisition
// record) must run so: the reservation may have expired by the time the
// message that made this Lock give it back came (a message can reach the
// store long after it was sent, if its path froze), and this Lock's own
// acquisition may have written the same record, unfenced, in the
// meantime. Between the two SETs of that acquisition, the VDEL would delete
// the key under it, and another Lock could take the key too.
func (l *Lease) WithTurn(ctx context.Context, f func()) {
	if err := l.Begin(ctx); err != nil {
		if errors.Is(err, ErrClosed) {
			f()
		}
		return
	}
	defer l.End()
	f()
}

// End gives the turn back.
func (l *Lease) End() {
	l.mu.Lock()
	l.busy = false
	if l.turnFree != nil {
		close(l.turnFree) // those waiting try again
		l.turnFree = nil
	}
	l.mu.Unlock()
}

// callbacks returns the Lock's runner of callbacks, made at its first use:
// a Lock that never holds (a candidate that never leads) needs none.
func (l *Lease) callbacks() *callbacks {
	if c := l.calls.Load(); c != nil {
		return c
	}
	l.calls.CompareAndSwap(nil, new(callbacks))
	return l.calls.Load()
}

func (l *Lease) holding() *holding {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

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

// DropReservation deletes the key if it is reserved for this Lock: a turn
// with a reservation that reached it too late to be handed on (its queue
// has ended) would keep the key from the next waiter until it expired.
// Like a release, it does not wait for a connection (see connNow): without
// one, the reservation expires after the TTL. The caller has the turn.
func (l *Lease) DropReservation(ctx context.Context) {
	conn, ctx, stop, err := l.connNow(ctx)
	if err != nil {
		l.log.Debug("not connected; a reservation of the key for this Lock, if any, expires after the TTL", "error", err)
		return
	}
	defer stop()
	rec := l.AcqRecord()
	res, err := conn.Get(ctx, l.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, rec) {
		return
	}
	if _, err := conn.VDel(ctx, l.cfg.Name, rec, sskv.DelOptions{FencingToken: res.Version}); err != nil {
		l.log.Debug("could not free the key reserved for this Lock; it expires after the TTL", "error", err)
	}
}

// endedRelease bounds a release asked for with a context already done:
// past a TTL, there is nothing left to release.
func endedRelease(ttl time.Duration) time.Duration { return min(ttl, time.Second) }

// Queue is a wait queue's part in a release (see package wait's queue).
type Queue interface {
	// HandOnKept: the release could not delete the key (no connection);
	// the turn goes on all the same, to be taken once the key is free.
	HandOnKept()
	// HandOver returns the first waiter, if any, to hand the lock to.
	HandOver() (first Next, ok bool)
	// SendTurn tells the first waiter its turn, with the token of the
	// reservation written for it, or zero.
	SendTurn(token hlc.Timestamp)
	// Release ends the queue's part in the release.
	Release()
}

// Next is the first waiter of a queue, as a release hands over to it.
type Next struct {
	ID      string
	Rec     []byte // its acquisition record, which a reservation writes
	Watches bool   // it watches the key: its turn goes out with the delete
}

// Release ends the holding and deletes the key if it is still this Lock's.
// The caller has the turn. With to (UnlockTo), a holding that lasted
// until now writes a reservation for to in place of the delete.
func (l *Lease) Release(ctx context.Context, to string, q Queue) (err error) {
	h := l.holding()
	if h.sched == nil { // never acquired
		return l.Wrap("unlock", ErrNotHeld)
	}
	if ctx.Err() != nil {
		// The caller's context has ended (a cancelled request, a shutdown
		// under way): the key would stay for a TTL. Try all the same,
		// within a short time of its own.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), endedRelease(l.cfg.TTL))
		defer cancel()
	}
	held := h.finish(ErrReleased) // false: it was lost (or released) before
	if !held && errors.Is(h.err(), ErrReleased) {
		return l.Wrap("unlock", ErrNotHeld)
	}
	var opts sskv.DelOptions
	if l.cfg.FenceKey {
		opts.FencingToken = h.token
	}
	conn, ctx, stop, err := h.releaseConn(ctx)
	if err != nil {
		// Nothing can be deleted: the key expires within its TTL. The queue
		// still goes to its first waiter, which takes the key once it is
		// free.
		if q != nil {
			q.HandOnKept()
			q.Release()
		}
		return l.Wrap("unlock", err)
	}
	defer stop()
	var first Next
	handover := false
	if q != nil {
		first, handover = q.HandOver()
		defer q.Release()
	}
	// Only a holding that lasted until now hands over with a reservation:
	// the key of one that was lost may be another's by now, not yet fenced
	// by it.
	if handover && held && l.cfg.FenceKey && !h.hasLate() {
		// One write hands the key to the longest waiter: the fence makes
		// sure it replaces only this holding's own record.
		res, err := conn.Set(ctx, l.cfg.Name, first.Rec, sskv.SetOptions{Expiry: l.cfg.TTL, FencingToken: h.token})
		// The turn goes to the first waiter whatever came of the SET: with
		// the reservation's token, or without one to take the key once it
		// is free.
		var token hlc.Timestamp
		if err == nil {
			token = res.Version
		}
		q.SendTurn(token)
		switch {
		case err == nil:
			l.log.Info("released; handed over", "to", first.ID)
			return nil
		case errors.Is(err, sskv.ErrFencingTokenLower):
			l.log.Info("released; a newer holder has the key")
			return nil
		case lost(conn) || errors.Is(err, sskv.ErrNotSent):
			return l.Wrap("unlock", fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err))
		}
		return l.Wrap("unlock", err)
	}
	if to != "" && q == nil {
		if held && !h.hasLate() {
			return l.handTo(ctx, conn, h, to)
		}
		// Lost, or a late write of the holding's may still land: the key may
		// be another's by now, not yet fenced by it. Deleted as by Unlock.
		why := h.err()
		if held {
			why = errors.New("a write of the holding whose outcome is unknown may still land")
		}
		defer func() {
			if err == nil {
				err = l.Wrap("unlock to", fmt.Errorf("not handed over to %q: %w", to, why))
			}
		}()
	}
	switch {
	case handover && first.Watches:
		// The turn goes out with the delete, not after its answer: the
		// first waiter watches the key, and takes it once it has both
		// (or, if the delete fails, when the key expires).
		q.SendTurn(hlc.Timestamp{})
	case handover:
		// After the delete: the first waiter, which does not watch the
		// key, takes it when its turn comes.
		defer q.SendTurn(hlc.Timestamp{})
	}
	// Without a fence there is no write that replaces only this holding's
	// record: the release deletes it, and the first waiter in the queue
	// takes it (see package wait's queue.go).
	res, err := conn.VDel(ctx, l.cfg.Name, h.record(), opts)
	// ErrNotSent: the connection is lost, though the client may not have
	// marked it so yet (the write failed first).
	if err != nil && (lost(conn) || errors.Is(err, sskv.ErrNotSent)) {
		err = fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err)
	}
	if errors.Is(err, sskv.ErrFencingTokenLower) {
		// A newer holding fences the key: it is not this one's any more.
		l.log.Info("released; a newer holder has the key")
		return nil
	}
	if err != nil {
		return l.Wrap("unlock", err)
	}
	l.log.Info("released", "deleted", res.Deleted)
	return nil
}

// handTo writes the reservation of the key for to, fenced with the token of
// h, the holding just released (see UnlockTo), on conn.
func (l *Lease) handTo(ctx context.Context, conn *sskv.Conn, h *holding, to string) error {
	_, err := conn.Set(ctx, l.cfg.Name, Reservation(to), sskv.SetOptions{Expiry: l.cfg.TTL, FencingToken: h.token})
	switch {
	case err == nil:
		l.log.Info("released; handed over", "to", to)
		return nil
	case errors.Is(err, sskv.ErrFencingTokenLower):
		return l.Wrap("unlock to", fmt.Errorf("not handed over to %q: a newer holder has the key: %w", to, err))
	case lost(conn) || errors.Is(err, sskv.ErrNotSent):
		return l.Wrap("unlock to", fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err))
	}
	return l.Wrap("unlock to", err)
}

// Wrap adds the lock's name, and the operation op if not empty, to err,
// saying "lock" once.
func (l *Lease) Wrap(op string, err error) error { return Wrap(l.cfg.Name, op, err) }

// Wrap adds the name of a lock, and the operation op if not empty, to err,
// saying "lock" once.
func Wrap(name, op string, err error) error { return &opError{name: name, op: op, err: err} }

// MarkClosed marks the Lease closed: Begin fails from now on. The caller
// has the turn.
func (l *Lease) MarkClosed() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

type opError struct {
	name, op string
	err      error
}

func (e *opError) Error() string {
	op := ""
	if e.op != "" {
		op = e.op + ": "
	}
	return fmt.Sprintf("lock %q: %s%s", e.name, op, strings.TrimPrefix(e.err.Error(), "lock: "))
}

func (e *opError) Unwrap() error { return e.err }

// lostError is the error of a lost holding: it wraps ErrLost and the reason.
type lostError struct{ reason error }

func (e *lostError) Error() string {
	return "lock: lost: " + strings.TrimPrefix(e.reason.Error(), "lock: ")
}

func (e *lostError) Unwrap() []error { return []error{ErrLost, e.reason} }

// Client returns the client the Lease acquires through.
func (l *Lease) Client() *sskv.Client { return l.c }

// Config returns the Lease's configuration; the caller does not change it.
func (l *Lease) Config() *Config { return &l.cfg }

// Log returns the Lease's logger.
func (l *Lease) Log() *slog.Logger { return l.log }

// Unknown reports whether the last attempt may have taken the key: its
// outcome is unknown, and AbandonThenEnd deletes what it may have written.
func (l *Lease) Unknown() bool { return len(l.undo) > 0 }

// Held reports whether the current holding lasts.
func (l *Lease) Held() bool { return l.holding().live() }

// Done is lock.Lock.Done.
func (l *Lease) Done() <-chan struct{} { return l.holding().ctx.Done() }

// Context is lock.Lock.Context.
func (l *Lease) Context() context.Context { return l.holding().ctx }

// Err is lock.Lock.Err.
func (l *Lease) Err() error { return l.holding().err() }

// Token is lock.Lock.Token.
func (l *Lease) Token() hlc.Timestamp { return l.holding().token }

// FencingToken is lock.Lock.FencingToken, with errors unwrapped.
func (l *Lease) FencingToken() (hlc.Timestamp, error) {
	h := l.holding()
	if err := h.check(); err != nil {
		return hlc.Timestamp{}, err
	}
	return h.token, nil
}

// FencingConn is lock.Lock.FencingConn, with errors unwrapped.
func (l *Lease) FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error) {
	h := l.holding()
	if err := h.check(); err != nil {
		return hlc.Timestamp{}, nil, err
	}
	cn, err := h.connection(ctx)
	if err != nil {
		return hlc.Timestamp{}, nil, err
	}
	return h.token, cn, nil
}

// Fenced is lock.Lock.Fenced.
func (l *Lease) Fenced(token hlc.Timestamp, err error) {
	if h := l.holding(); h.token == token {
		h.lose(fmt.Errorf("%w: %w", ErrFenced, err))
	}
}

// SetValue is lock.Lock.SetValue once its turn is taken, with errors
// unwrapped.
func (l *Lease) SetValue(ctx context.Context, value []byte) error {
	h := l.holding()
	if err := h.check(); err != nil {
		return err
	}
	value = bytes.Clone(value)
	l.mu.Lock()
	prev := l.val
	l.val = value
	l.mu.Unlock()
	if _, err := h.write(ctx, l.record(h.token, value)); err != nil {
		if errors.Is(err, sskv.ErrTooLarge) {
			// Not sent, and write kept the record it had: so does the Lease.
			l.mu.Lock()
			l.val = prev
			l.mu.Unlock()
		}
		return err
	}
	return nil
}

// NotHeldContext is the Context of a Lease that holds nothing yet: ended,
// with cause ErrNotHeld.
func NotHeldContext() context.Context { return notHeld.ctx }

// Cap ends the current holding as lost (ErrMaxHold) after d, unless it
// ends before.
func (l *Lease) Cap(d time.Duration) {
	h := l.holding()
	t := time.AfterFunc(d, func() { h.lose(fmt.Errorf("%w (%v)", ErrMaxHold, d)) })
	context.AfterFunc(h.ctx, func() { t.Stop() })
}
