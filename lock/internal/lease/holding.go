package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// holding is one acquisition of a Lock, from the SET that took the key to
// its loss or release. Its context is the Lock's Context while it lasts.
type holding struct {
	l      *Lease
	token  hlc.Timestamp
	ctx    context.Context
	cancel context.CancelCauseFunc
	sched  *renewer // renews it; nil for a Lock that holds nothing yet
	// guards counts the guard while it runs: finish waits for it. A
	// WaitGroup, not a channel: it costs the holding no allocation.
	guards sync.WaitGroup

	scheduling // guarded by sched.mu

	writeMu sync.Mutex // one write (renewal, SetValue) or confirmation at a time
	// stopGuard ends the guard's watch when the holding ends; nil while
	// there is none. Guarded by mu.
	stopGuard func()
	// capped ends the holding at Config.MaxHold; nil without a cap.
	capped *time.Timer
	// stopWrite ends the context of the write or confirmation in progress
	// (see within) when the holding ends; nil while there is none. Guarded
	// by mu.
	stopWrite context.CancelFunc

	mu    sync.Mutex
	ended bool
	// The booleans side by side: the holding is a size class smaller.
	rewrite bool      // rec changed (SetValue) and may not be in the key yet
	recheck bool      // the key must be confirmed before the next write (see conn)
	expires time.Time // last successful renewal (or acquisition) sent + RenewDeadline
	lastErr error     // of the renewals since the last successful one
	rec     []byte    // the key's value while this holding lasts
	// Continuity: the holding's writes go out only on conn, the connection
	// on which the key was last seen at version, the version of the
	// holding's last write. After a reconnect (conn is done), or when the
	// guard's watch lost track of the key (recheck), a read must find the
	// key still at version before anything more is written: see confirm.
	conn    *sskv.Conn
	version hlc.Timestamp
	// late is a record of this holding's own that confirm found at a
	// version it never wrote (a late request of its own): release deletes
	// it, once the work has returned.
	late []byte
	// acquired is the version of the acquisition's last write: the guard
	// takes what the key went through before it as the acquisition's own
	// business (see judge).
	acquired hlc.Timestamp
}

// notHeld is the holding of every Lock that holds nothing yet. Ended, it
// never changes, and the Locks share it.
var notHeld = endedHolding(ErrNotHeld)

// endedHolding is the holding of a Lock that holds nothing yet: ended, with
// cause as its error.
func endedHolding(cause error) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return &holding{ctx: ctx, cancel: cancel, ended: true, scheduling: scheduling{index: -1}}
}

// newHolding returns the holding of token, acquired by a SET sent at sent
// through conn, whose last write left rec in the key at version. The caller
// starts it.
func newHolding(l *Lease, token hlc.Timestamp, rec []byte, sent time.Time, conn *sskv.Conn, version hlc.Timestamp) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &holding{
		l:          l,
		token:      token,
		ctx:        ctx,
		cancel:     cancel,
		sched:      renewerOf(l.c),
		expires:    sent.Add(l.cfg.RenewDeadline),
		rec:        rec,
		conn:       conn,
		version:    version,
		acquired:   version,
		scheduling: scheduling{index: -1},
	}
}

// start has the client's renewer renew the holding, acquired by a SET sent
// at sent, and with FenceKey starts its guard, which goes on with ww, the
// waiter's watch, unless it is none. The renewer has it first: the guard may
// judge events at once (those the waiter had not read), and a holding it
// loses must leave the renewer's schedule.
func (h *holding) start(sent time.Time, ww KeyWatch) {
	if h.l.cfg.FenceKey {
		h.guards.Add(1)
	}
	if max := h.l.cfg.MaxHold; max > 0 {
		// Set under mu before anything can end the holding, which stops it.
		h.mu.Lock()
		h.capped = time.AfterFunc(time.Until(sent.Add(max)), func() {
			h.lose(fmt.Errorf("%w (%v)", ErrMaxHold, max))
		})
		h.mu.Unlock()
	}
	h.sched.add(h, sent)
	if h.l.cfg.FenceKey {
		h.guard(ww)
	}
}

// expiry returns the renew deadline.
func (h *holding) expiry() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.expires
}

// lastConn returns the connection the holding last saw its key on, without
// confirming anything (see connection for one its writes may go out on).
func (h *holding) lastConn() *sskv.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conn
}

// record returns the key's value while this holding lasts, or the late
// record of its own that ended it (see confirm).
func (h *holding) record() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.late != nil {
		return h.late
	}
	return h.rec
}

// hasLate reports whether confirm found a late record of this holding's
// own in the key.
func (h *holding) hasLate() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.late != nil
}

func (h *holding) live() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.ended
}

// err is nil while the holding lasts, and why it ended after.
func (h *holding) err() error {
	if h.ctx.Err() == nil {
		return nil
	}
	return context.Cause(h.ctx)
}

// check returns nil if the holding lasts and its renew deadline has not
// passed on the monotonic clock; otherwise it ends the holding if needed and
// returns why it ended.
func (h *holding) check() error {
	h.mu.Lock()
	passed := !h.ended && !time.Now().Before(h.expires)
	h.mu.Unlock()
	if passed {
		h.deadline()
	}
	return h.err()
}

// endWith ends the holding with cause and reports whether this call ended it.
func (h *holding) endWith(cause error) bool {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return false
	}
	h.ended = true
	stop, stopWrite := h.stopGuard, h.stopWrite
	h.stopGuard, h.stopWrite = nil, nil
	if h.capped != nil {
		h.capped.Stop()
	}
	h.mu.Unlock()
	h.cancel(cause)
	if stopWrite != nil {
		stopWrite()
	}
	if stop != nil {
		stop()
	}
	if h.sched != nil {
		h.sched.remove(h)
	}
	return true
}

// keepGuard has the end of the holding end the guard's watch with stop, or
// calls stop at once if the holding has ended. The watch is tied to no
// context: that would cost each holding an AfterFunc.
func (h *holding) keepGuard(stop func()) {
	h.mu.Lock()
	if !h.ended {
		h.stopGuard = stop
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	stop()
}

// lose ends the holding as lost for reason.
func (h *holding) lose(reason error) {
	if h.endWith(&lostError{reason}) {
		h.l.log.Warn("lost", "token", h.token, "reason", reason)
	}
}

// finish ends the holding with cause, waits for a write of it in flight
// and for its guard to return, and reports whether this call ended it.
func (h *holding) finish(cause error) bool {
	ended := h.endWith(cause)
	// Wait for a write in flight, which then sees the holding ended.
	h.writeMu.Lock()
	//lint:ignore SA2001 the critical section is the wait
	h.writeMu.Unlock()
	h.guards.Wait()
	return ended
}

// deadline loses the holding if its renew deadline has passed. The renewer
// calls it when the deadline comes; a renewal that succeeded meanwhile has
// moved the deadline on.
func (h *holding) deadline() {
	h.mu.Lock()
	if h.ended || time.Now().Before(h.expires) {
		h.mu.Unlock()
		return
	}
	last := h.lastErr
	h.mu.Unlock()
	reason := ErrRenewDeadline
	if last != nil {
		reason = fmt.Errorf("%w (last renewal: %w)", ErrRenewDeadline, last)
	}
	h.lose(reason)
}

// renewed records a successful renewal sent at sent. It reports false when
// the holding had already ended, or its deadline passed before the answer
// came (the holding is then lost: it may have been lost in between).
func (h *holding) renewed(sent time.Time) bool {
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return false
	}
	if !time.Now().Before(h.expires) {
		h.mu.Unlock()
		h.deadline()
		return false
	}
	h.expires = sent.Add(h.l.cfg.RenewDeadline)
	h.lastErr = nil
	h.mu.Unlock()
	return true
}

// errEnded: the holding has ended (lost or released) while a write for it
// was under way or about to start.
var errEnded = errors.New("lock: holding ended")

// write sends one renewal of the holding with rec as the key's value: SET
// NEX PX, fenced with the token under FenceKey; or, when rec is new
// (SetValue), an unconditional SET fenced with the token. After a reconnect
// it first confirms that the key is still as the holding left it (confirm).
// It reports when the write was sent (zero if it was not). It returns nil
// when the lease was renewed, errEnded when the holding ended (now or
// before), and otherwise the request's error: the outcome is unknown, and
// the next write, of the same rec, settles it. The exception is a new rec
// too large for the broker (sskv.ErrTooLarge): not sent, and the holding
// keeps its earlier rec.
func (h *holding) write(ctx context.Context, rec []byte) (time.Time, error) {
	l := h.l
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return time.Time{}, errEnded
	}
	newRec := rec != nil
	prevRec, prevRewrite := h.rec, h.rewrite
	if newRec {
		h.rec, h.rewrite = rec, true
	}
	rec, rewrite, expires := h.rec, h.rewrite, h.expires
	h.mu.Unlock()

	ctx, release := h.within(ctx, expires)
	defer release()
	conn, err := h.confirm(ctx)
	if err != nil {
		if h.ctx.Err() != nil {
			return time.Time{}, errEnded
		}
		h.failed(err)
		return time.Time{}, err
	}
	opts := sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: l.cfg.TTL}
	if l.cfg.FenceKey {
		opts.FencingToken = h.token
		if rewrite {
			opts.Condition = sskv.Always
		}
	}
	sent := time.Now()
	res, err := conn.Set(ctx, l.cfg.Name, rec, opts)
	switch {
	case err == nil && res.Applied:
		h.mu.Lock()
		h.rewrite = false
		h.version = res.Version
		h.mu.Unlock()
		if !h.renewed(sent) {
			return sent, errEnded
		}
		return sent, nil
	case err == nil:
		h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, res.Version))
		return sent, errEnded
	case errors.Is(err, sskv.ErrNotSent):
		sent = time.Time{} // its connection was lost first: the next write confirms on the next one
	case errors.Is(err, sskv.ErrClosed):
		h.lose(fmt.Errorf("%w: %w", ErrClosed, err))
		return sent, errEnded
	case errors.Is(err, sskv.ErrFencingTokenLower):
		h.lose(fmt.Errorf("%w (a newer token fences the key)", ErrHeldByOther))
		return sent, errEnded
	case newRec && errors.Is(err, sskv.ErrTooLarge):
		// A new record too large for the broker was not sent, and never
		// would be: the renewals go on with the one the key has.
		h.mu.Lock()
		h.rec, h.rewrite = prevRec, prevRewrite
		h.mu.Unlock()
		return time.Time{}, err
	}
	if h.ctx.Err() != nil { // ended while writing
		return sent, errEnded
	}
	h.failed(err)
	return sent, err
}

// failed records the error of a write that failed. A write cut short by the
// renew deadline itself does not replace an earlier, more telling error:
// the deadline is reported anyway.
func (h *holding) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastErr == nil || !errors.Is(err, context.DeadlineExceeded) {
		h.lastErr = err
	}
}

// confirm returns the connection the holding may write through. That is the
// one on which it last saw its key, unless that connection was lost or the
// guard's watch lost track of the key: then it reads the key, on the
// client's current connection, and goes on only if the key still holds the
// version of the holding's last write. Whatever may have happened in
// between (the key deleted by hand, lost in a store restart, taken and
// released by another holder, re-created by a late request of this one) has
// changed the version or removed the key, and ends the holding as lost: the
// store may have let another holder in meanwhile. A record of this
// holding's that a late request of its own wrote is left for release to
// delete (VDEL), once the work has returned: deleted now, it would let a
// waiter in while the work may still run. It returns errEnded when the
// holding ended, and the request's error when the read failed: the next
// write tries again.
func (h *holding) confirm(ctx context.Context) (*sskv.Conn, error) {
	l := h.l
	if conn, ok := h.settled(); ok {
		return conn, nil
	}
	h.mu.Lock()
	version := h.version
	h.mu.Unlock()
	next, err := l.c.Connection(ctx)
	if err != nil {
		return nil, err
	}
	res, err := next.Get(ctx, l.cfg.Name)
	if err != nil {
		return nil, err
	}
	if h.ctx.Err() != nil {
		return nil, errEnded
	}
	switch {
	case !res.Found:
		h.lose(fmt.Errorf("%w: it was deleted while this holder could not see it (by hand, by expiry, or lost in a store restart)", ErrKeyLost))
		return nil, errEnded
	case res.Version != version:
		holder := ParseHolder(res.Value, res.Version)
		if holder.ID != l.cfg.HolderID {
			h.lose(fmt.Errorf("%w (found %q at version %v after a reconnect)", ErrHeldByOther, holder.ID, res.Version))
			return nil, errEnded
		}
		// This holder's record, written after its last known write: a
		// request of its own that arrived late, possibly after the key had
		// vanished and another holder had come and gone. Unlock takes it
		// back; until then it keeps waiters out, as the holding did.
		h.mu.Lock()
		h.late = res.Value
		h.mu.Unlock()
		h.lose(fmt.Errorf("%w: found at version %v, written by a late request of this holder, after its last known write %v", ErrKeyLost, res.Version, version))
		return nil, errEnded
	}
	h.mu.Lock()
	h.conn, h.recheck = next, false
	h.mu.Unlock()
	return next, nil
}

// guard watches the key while a FenceKey holding lasts, and loses the
// holding as soon as the key is deleted (by someone else, or lost by a
// store) or taken by another holder. A renewal could not tell: its SET NEX
// would simply create the key again, after another holder may have held
// it in between. When the watch reports that it lost track of the key (a
// Resync), the guard has the renewer confirm the key at once. The guard is
// a callback watch (judge), with no goroutine of its own: it goes on with
// the waiter's watch ww (unless none), handed off to judge, or else watches
// the key anew, from a goroutine that lasts only until the watch is
// registered. It marks h.guards done once the watch has ended, after the
// holding did (or when there is no watch).
func (h *holding) guard(ww KeyWatch) {
	l := h.l
	if ww.W != nil {
		if !ww.Box.handoff(h) {
			// The waiter's watch has ended: the renewals alone guard the key.
			ww.End()
			h.guards.Done()
			return
		}
		// The watch ends with the holding.
		h.keepGuard(ww.Ender())
		return
	}
	go func() {
		// The end of the holding ends the registration, then the watch
		// (keepGuard). The registration's context is its own, not a child
		// of h.ctx: a child would leave h.ctx the map of its children (a
		// few hundred bytes) for as long as the holding lasts. The Stop of
		// a callback watch does not wait for the answer to its KEYNOTIFY
		// STOP, which goes out in the background: the end of the holding
		// (Unlock, Resign) does not wait for it either.
		rctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		h.keepGuard(cancel)
		w, err := l.c.Watch(rctx, l.cfg.Name, sskv.WithCallback(h.watched, h.guardEnded), sskv.Detached())
		if err != nil {
			if h.ctx.Err() == nil {
				l.log.Debug("cannot watch the held key; renewals alone guard it", "error", err)
			}
			h.guards.Done()
			return
		}
		h.keepGuard(w.Stop)
	}()
}

// watched is the callback of the guard's own watch. Its first event is the
// key's state as the watch started: a change made while the watch was set
// up shows there. That state may also predate this holding's own writes:
// a watch that joins the client's existing watch of the key starts from
// the last state notified, which the notification of the acquisition may
// not have reached yet. So a first event showing the key missing or
// another's is not taken as a loss: it has the key confirmed (a read)
// before the next write, which loses the holding if it is.
func (h *holding) watched(ev sskv.Event) {
	if !ev.Initial {
		h.judge(ev)
		return
	}
	if ev.Op == sskv.OpDelete || ParseHolder(ev.Value, ev.Version).ID != h.l.cfg.HolderID {
		h.askConfirm()
	}
}

// guardEnded is called once the guard's watch has ended: with the holding,
// or before it (the client closed, the service refused to watch the key
// again after a reconnect), and then the renewals alone guard the key.
func (h *holding) guardEnded(err error) {
	if h.ctx.Err() == nil {
		h.l.log.Debug("the watch of the held key ended; renewals alone guard it", "error", err)
	}
	h.guards.Done()
}

// judge loses the holding if ev shows that its key is not its own any more.
func (h *holding) judge(ev sskv.Event) {
	l := h.l
	own := ev.Op == sskv.OpSet && ParseHolder(ev.Value, ev.Version).ID == l.cfg.HolderID
	switch {
	case ev.Initial:
		// The state a waiter's watch started from, before this holding,
		// not yet taken by the waiter.
	case ev.Resync && ev.Op == sskv.OpDelete:
		h.lose(fmt.Errorf("%w: it was deleted while the holder's watch had lost track of it", ErrKeyLost))
	case ev.Resync && !own:
		h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, ev.Version))
	case ev.Resync:
		h.askConfirm() // its own record; but the holder may have missed changes
	case ev.Version.Before(h.token):
		// A change from before this holding, still queued on the waiter's
		// watch: the previous holder's renewals and release.
	case own:
	case !ev.Version.After(h.acquired):
		// A change the acquisition's fenced SET overwrote: made between
		// the SET that took the key and the one that fenced it.
	case ev.Op == sskv.OpDelete:
		h.lose(fmt.Errorf("%w: it was deleted", ErrKeyLost))
	default:
		h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, ev.Version))
	}
}

// settled returns the connection the holding last saw its key on, and
// whether its writes may go out on it without a confirmation: it is up, and
// the guard has not asked for one.
func (h *holding) settled() (*sskv.Conn, bool) {
	h.mu.Lock()
	conn, recheck := h.conn, h.recheck
	h.mu.Unlock()
	select {
	case <-conn.Done():
		return conn, false
	default:
		return conn, !recheck
	}
}

// connection returns the connection the holding's writes go out on,
// confirming the key first if it must (see confirm), within ctx and the
// renew deadline. It returns why the holding ended, if it did.
func (h *holding) connection(ctx context.Context) (*sskv.Conn, error) {
	if conn, ok := h.settled(); ok {
		return conn, nil
	}
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.mu.Lock()
	expires := h.expires
	h.mu.Unlock()
	ctx, release := h.within(ctx, expires)
	defer release()
	conn, err := h.confirm(ctx)
	if h.ctx.Err() != nil {
		return nil, h.err()
	}
	return conn, err
}

// within returns ctx, ended also at expires (the renew deadline) and when
// the holding ends, and the function that releases it. The caller holds
// writeMu: there is one at a time.
//
// The end of the holding ends it through stopWrite, and the renewer gives
// it context.Background, not h.ctx: no context of the library's is a child
// of h.ctx. A child, even one long gone, leaves h.ctx the map of its
// children (a few hundred bytes) for as long as the holding lasts.
func (h *holding) within(ctx context.Context, expires time.Time) (context.Context, func()) {
	ctx, cancel := context.WithDeadline(ctx, expires)
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		cancel()
		return ctx, cancel
	}
	h.stopWrite = cancel
	h.mu.Unlock()
	return ctx, func() {
		h.mu.Lock()
		h.stopWrite = nil
		h.mu.Unlock()
		cancel()
	}
}

// recheckNow confirms the key (see confirm) without writing. It returns
// errEnded when the holding ended; another error leaves the confirmation to
// the next write.
func (h *holding) recheckNow() error {
	_, err := h.connection(context.Background()) // within ends it with the holding
	if h.ctx.Err() != nil {
		return errEnded
	}
	return err
}

// askConfirm has the renewer read the key now, and before its next write
// (see confirm).
func (h *holding) askConfirm() {
	h.mu.Lock()
	h.recheck = true
	h.mu.Unlock()
	h.sched.poke(h)
}

// releaseConn returns the connection release deletes the key on, and ctx
// bounded for it. Release does not wait for a store that is away: a
// release whose connection is lost ends at once, its outcome unknown,
// instead of waiting for a reconnection that may never come (a store that
// was shut down, a test that closed it first). After a reconnect, it goes
// out on the client's current connection: VDEL deletes only this holding's
// own record, so it needs no confirmation of the key first.
func (h *holding) releaseConn(ctx context.Context) (*sskv.Conn, context.Context, func(), error) {
	l := h.l
	h.mu.Lock()
	conn := h.conn
	h.mu.Unlock()
	if conn == nil || lost(conn) {
		return l.connNow(ctx)
	}
	ctx, stop := boundTo(ctx, conn)
	return conn, ctx, stop, nil
}

// connNow returns the client's connection if it is up now, without waiting
// for one, and ctx bounded by it (see boundTo). The requests a Lock makes
// as it ends (Unlock, Close) do not wait for a store that is away (shut
// down, or restarted elsewhere, or a test that closed it first): what they
// would delete expires within its TTL.
func (l *Lease) connNow(ctx context.Context) (*sskv.Conn, context.Context, func(), error) {
	conn, err := ConnNow(l.c)
	if err != nil {
		if errors.Is(err, sskv.ErrClosed) {
			return nil, nil, nil, err
		}
		return nil, nil, nil, fmt.Errorf("%w, and the client has not reconnected; the key expires within its TTL", ErrNotReleased)
	}
	ctx, stop := boundTo(ctx, conn)
	return conn, ctx, stop, nil
}

// ConnNow returns c's current connection, without waiting for one.
func ConnNow(c *sskv.Client) (*sskv.Conn, error) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	return c.Connection(done)
}

// boundTo returns ctx, ended also when conn is lost: a request bound to a
// connection that is lost in flight would otherwise wait for the next
// connection to learn that its outcome is unknown. stop releases it.
func boundTo(ctx context.Context, conn *sskv.Conn) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-conn.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// lost reports whether conn is lost.
func lost(conn *sskv.Conn) bool {
	select {
	case <-conn.Done():
		return true
	default:
		return false
	}
}
