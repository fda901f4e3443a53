package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// holding is one acquisition of a Lock, from the SET that took the key to
// its loss or release. Its context is the Lock's Context while it lasts.
type holding struct {
	l      *Lock
	token  hlc.Timestamp
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{} // closed when the holding ends: the renew loop stops
	loop   chan struct{} // closed when the renew loop has returned; nil if there is none
	timer  *time.Timer   // loses the holding at expires

	writeMu sync.Mutex // one renewal or SetValue at a time
	watch   *waitWatch // the waiter's watch, for the guard to go on with; may be nil

	mu      sync.Mutex
	ended   bool
	expires time.Time // last successful renewal (or acquisition) sent + RenewDeadline
	lastErr error     // of the renewals since the last successful one
	rec     []byte    // the key's value while this holding lasts
	rewrite bool      // rec changed (SetValue) and may not be in the key yet
}

// endedHolding is the holding of a Lock that holds nothing yet: ended, with
// cause as its error.
func endedHolding(cause error) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return &holding{ctx: ctx, cancel: cancel, ended: true}
}

// newHolding starts the holding of token, acquired by a SET sent at sent
// that wrote rec. The caller starts its renew loop.
func newHolding(l *Lock, token hlc.Timestamp, rec []byte, sent time.Time) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &holding{
		l:       l,
		token:   token,
		ctx:     ctx,
		cancel:  cancel,
		stop:    make(chan struct{}),
		loop:    make(chan struct{}),
		expires: sent.Add(l.cfg.RenewDeadline),
		rec:     rec,
	}
	h.timer = time.AfterFunc(time.Until(h.expires), h.deadline)
	return h
}

// record returns the key's value while this holding lasts.
func (h *holding) record() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rec
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
	h.mu.Unlock()
	if h.timer != nil {
		h.timer.Stop()
	}
	h.cancel(cause)
	if h.stop != nil {
		close(h.stop)
	}
	return true
}

// lose ends the holding as lost for reason.
func (h *holding) lose(reason error) {
	if h.endWith(&lostError{reason}) {
		h.l.log.Warn("lost", "token", h.token, "reason", reason)
	}
}

// finish ends the holding with cause, waits for its renew loop to return and
// reports whether this call ended it.
func (h *holding) finish(cause error) bool {
	ended := h.endWith(cause)
	if h.loop != nil {
		<-h.loop
	}
	return ended
}

// deadline loses the holding if its renew deadline has passed. The timer
// calls it; a renewal that succeeded meanwhile has moved the deadline on.
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
	until := time.Until(h.expires)
	h.mu.Unlock()
	h.timer.Reset(until)
	return true
}

// errEnded: the holding has ended (lost or released) while a write for it
// was under way or about to start.
var errEnded = errors.New("lock: holding ended")

// write sends one renewal of the holding with rec as the key's value: SET
// NEX PX, fenced with the token under FenceKey; or, when rec is new
// (SetValue), an unconditional SET fenced with the token. It reports when it
// was sent. It returns nil when the lease was renewed, errEnded when the
// holding ended (now or before), and otherwise the request's error: the
// outcome is unknown, and the next write, of the same rec, settles it.
func (h *holding) write(ctx context.Context, rec []byte) (time.Time, error) {
	l := h.l
	h.writeMu.Lock()
	defer h.writeMu.Unlock()
	h.mu.Lock()
	if h.ended {
		h.mu.Unlock()
		return time.Time{}, errEnded
	}
	if rec != nil {
		h.rec, h.rewrite = rec, true
	}
	rec, rewrite, expires := h.rec, h.rewrite, h.expires
	h.mu.Unlock()

	ctx, cancel := context.WithDeadline(ctx, expires)
	defer cancel()
	stop := context.AfterFunc(h.ctx, cancel)
	defer stop()
	opts := sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: l.cfg.TTL}
	if l.cfg.FenceKey {
		opts.FencingToken = h.token
		if rewrite {
			opts.Condition = sskv.Always
		}
	}
	sent := time.Now()
	res, err := l.c.Set(ctx, l.cfg.Name, rec, opts)
	switch {
	case err == nil && res.Applied:
		h.mu.Lock()
		h.rewrite = false
		h.mu.Unlock()
		if !h.renewed(sent) {
			return sent, errEnded
		}
		return sent, nil
	case err == nil:
		h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, res.Version))
		return sent, errEnded
	case errors.Is(err, sskv.ErrFencingTokenLower):
		h.lose(fmt.Errorf("%w (a newer token fences the key)", ErrHeldByOther))
		return sent, errEnded
	case errors.Is(err, sskv.ErrClosed):
		h.lose(fmt.Errorf("%w: %w", ErrClosed, err))
		return sent, errEnded
	case h.ctx.Err() != nil: // ended while writing
		return sent, errEnded
	}
	h.mu.Lock()
	h.lastErr = err
	h.mu.Unlock()
	return sent, err
}

// renewLoop renews the lease every RenewInterval, and sooner after a
// failure, until the holding ends. Each renewal is bounded by the renew
// deadline, so it never outlasts the holding.
func (h *holding) renewLoop() {
	defer close(h.loop)
	l := h.l
	if l.cfg.FenceKey {
		guarded := make(chan struct{})
		go h.guard(guarded)
		defer func() { <-guarded }()
	}
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = max(l.cfg.RenewInterval/20, time.Millisecond)
	retry.MaxInterval = max(l.cfg.RenewInterval/4, time.Millisecond)
	retry.MaxElapsedTime = 0
	retry.Reset()

	h.mu.Lock()
	first := time.Until(h.expires.Add(l.cfg.RenewInterval - l.cfg.RenewDeadline))
	h.mu.Unlock()
	next := time.NewTimer(first)
	defer next.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-l.c.Done():
			h.lose(fmt.Errorf("%w: %w", ErrClosed, sskv.ErrClosed))
			return
		case <-next.C:
		}
		sent, err := h.write(h.ctx, nil)
		if l.cfg.OnRenewal != nil && !sent.IsZero() {
			rerr := err
			if errors.Is(err, errEnded) {
				rerr = h.err()
			}
			l.cfg.OnRenewal(time.Since(sent), rerr)
		}
		switch {
		case err == nil:
			retry.Reset()
			next.Reset(l.cfg.RenewInterval - time.Since(sent))
		case errors.Is(err, errEnded):
			return
		default:
			// The outcome is unknown; the next renewal, with the same value,
			// is harmless whether or not this one was applied.
			l.log.Debug("renewal failed; retrying", "error", err)
			next.Reset(retry.NextBackOff())
		}
	}
}

// guard watches the key while a FenceKey holding lasts, and loses the
// holding as soon as the key is deleted (by someone else, or lost by a
// store) or taken by another holder. A renewal could not tell: its SET NEX
// would simply create the key again, after another holder may have held
// it in between. It closes done when it returns, after the holding ended.
func (h *holding) guard(done chan<- struct{}) {
	defer close(done)
	l := h.l
	var w *sskv.Watcher
	if h.watch != nil {
		w = h.watch.w
		stop := context.AfterFunc(h.ctx, h.watch.cancel)
		defer stop()
		defer h.watch.cancel()
	} else {
		var err error
		if w, err = l.c.Watch(h.ctx, l.cfg.Name); err != nil {
			if h.ctx.Err() == nil {
				l.log.Debug("cannot watch the held key; renewals alone guard it", "error", err)
			}
			<-h.ctx.Done()
			return
		}
		// No Stop: the watch ends with h.ctx, and its KEYNOTIFY STOP goes out
		// in the background. Stop would wait for the STOP's answer, and the
		// end of the holding (Unlock, Resign) with it: up to the client's
		// RequestTimeout when that answer is lost.
		// The watch reports changes after it was set up; one made while it
		// was, shows in a read.
		if res, err := l.c.Get(h.ctx, l.cfg.Name); err == nil && ParseHolder(res.Value, res.Version).ID != l.cfg.HolderID {
			h.lose(fmt.Errorf("%w (the key was deleted or taken)", ErrHeldByOther))
		}
	}
	for {
		select {
		case <-h.ctx.Done():
			return
		case ev, ok := <-w.Events():
			switch {
			case !ok:
				<-h.ctx.Done()
				return
			case !ev.Version.IsZero() && ev.Version.Before(h.token):
				// A change from before this holding, still queued on the
				// waiter's watch: the previous holder's renewals and release.
			case ev.Op == sskv.OpDelete:
				h.lose(fmt.Errorf("%w (the key was deleted)", ErrHeldByOther))
			case ParseHolder(ev.Value, ev.Version).ID != l.cfg.HolderID:
				h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, ev.Version))
			}
		}
	}
}
