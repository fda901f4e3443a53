package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

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

// MarkClosed marks the Lease closed: Begin fails from now on. The caller
// has the turn.
func (l *Lease) MarkClosed() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

// Ended returns why a TryLock or Lock call that has just taken the turn
// must not go on: Close has started (ErrClosed; it sets that before it ends
// the calls' contexts, one by one), or ctx has ended. Nil otherwise.
func (l *Lease) Ended(ctx context.Context) error {
	l.mu.Lock()
	closing := l.closing
	l.mu.Unlock()
	if closing {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return l.ClosedErr(ctx, err)
	}
	return nil
}
