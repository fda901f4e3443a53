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

	mu      sync.Mutex
	ended   bool
	expires time.Time // last successful renewal (or acquisition) sent + RenewDeadline
	lastErr error     // of the renewals since the last successful one
}

// endedHolding is the holding of a Lock that holds nothing yet: ended, with
// cause as its error.
func endedHolding(cause error) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return &holding{ctx: ctx, cancel: cancel, ended: true}
}

// newHolding starts the holding of token, acquired by a SET sent at sent.
// The caller starts its renew loop.
func newHolding(l *Lock, token hlc.Timestamp, sent time.Time) *holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &holding{
		l:       l,
		token:   token,
		ctx:     ctx,
		cancel:  cancel,
		stop:    make(chan struct{}),
		loop:    make(chan struct{}),
		expires: sent.Add(l.cfg.RenewDeadline),
	}
	h.timer = time.AfterFunc(time.Until(h.expires), h.deadline)
	return h
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

// renewLoop renews the lease every RenewInterval (SET NEX PX with the same
// value), and sooner after a failure, until the holding ends. Each renewal
// is bounded by the renew deadline, so it never outlasts the holding.
func (h *holding) renewLoop() {
	defer close(h.loop)
	l := h.l
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
		case <-next.C:
		}
		h.mu.Lock()
		expires := h.expires
		h.mu.Unlock()
		ctx, cancel := context.WithDeadline(h.ctx, expires)
		sent := time.Now()
		res, err := l.c.Set(ctx, l.cfg.Name, l.value, sskv.SetOptions{
			Condition: sskv.IfEqualOrNotExists,
			Expiry:    l.cfg.TTL,
		})
		cancel()
		switch {
		case err == nil && res.Applied:
			if !h.renewed(sent) {
				return
			}
			retry.Reset()
			next.Reset(l.cfg.RenewInterval - time.Since(sent))
		case err == nil:
			h.lose(fmt.Errorf("%w (key version %v)", ErrHeldByOther, res.Version))
			return
		case errors.Is(err, sskv.ErrClosed):
			h.lose(fmt.Errorf("%w: %w", ErrClosed, err))
			return
		case h.ctx.Err() != nil: // ended while renewing
			return
		default:
			// The outcome is unknown; the next renewal, with the same value,
			// is harmless whether or not this one was applied.
			h.mu.Lock()
			h.lastErr = err
			h.mu.Unlock()
			l.log.Debug("renewal failed; retrying", "error", err)
			next.Reset(retry.NextBackOff())
		}
	}
}
