package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// Wrap adds the lock's name, and the operation op if not empty, to err,
// saying "lock" once.
func (l *Lease) Wrap(op string, err error) error { return Wrap(l.cfg.Name, op, err) }

// Wrap adds the name of a lock, and the operation op if not empty, to err,
// saying "lock" once.
func Wrap(name, op string, err error) error { return &opError{name: name, op: op, err: err} }

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
