package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// DefaultMaxReaders is RWMutexConfig.MaxReaders when it is zero.
const DefaultMaxReaders = 16

// RWMutexConfig configures a participant of an [RWMutex]. HolderID, TTL,
// RenewInterval, RenewDeadline, Logger and OnRenewal mean what they mean in
// [Config] and apply to every key the participant holds; MaxHold caps its
// holdings, reads and writes alike.
type RWMutexConfig struct {
	// Name is the lock's record key; its gate is RWMutexGate(Name) and its
	// reader slots RWMutexReader(Name, i).
	Name string
	// MaxReaders is how many may hold the lock for reading at once, 1 to
	// 1000 (default 16): one slot key each. A writer reads every slot, so
	// its Lock costs MaxReaders requests more. The first participant writes
	// it to the record (SET NX, no expiry); one with another value fails
	// with ErrLimitMismatch. Change it only while nobody runs.
	MaxReaders                        int
	HolderID                          string
	TTL, RenewInterval, RenewDeadline time.Duration
	// MaxHold, if positive, caps each holding, read or write, as
	// Config.MaxHold caps a Lock's: MaxHold after it began, on the holder's
	// own monotonic clock, it ends as lost (Err wraps ErrLost and
	// ErrMaxHold) even while its renewals succeed; its key is released by
	// RUnlock or Unlock once the work has returned, or expires within TTL.
	// A read holding begins with the request that took its slot; a write
	// holding once every reader slot was seen free, so that the wait for
	// the readers to leave does not count. Zero: no cap.
	MaxHold   time.Duration
	Logger    *slog.Logger
	OnRenewal func(latency time.Duration, err error)
}

// RWMutexGate returns the key of the gate of the RWMutex name: a FenceKey
// Lock that a writer holds while it writes and a reader while it enters.
func RWMutexGate(name string) string { return name + "\x00gate" }

// RWMutexReader returns the key of reader slot i of the RWMutex name.
func RWMutexReader(name string, i int) string { return name + "\x00r\x00" + strconv.Itoa(i) }

const rwRecordPrefix = lease.RWRecordPrefix

// RWMutex is one participant of a read-write lock on the state store: many
// readers or one writer, writers first. A writer holds the gate, a queued
// FenceKey Lock, for its whole holding; a reader takes the gate, then a free
// reader slot (a Lock of its own), then gives the gate back. A writer that
// took the gate waits until every slot has been seen free: no reader can
// take one meanwhile. So readers that arrive after a waiting writer queue
// behind it on the gate, and a writer's token (the gate's) is newer than
// every earlier reader's (its slot's) and writer's.
//
// A participant holds at most one holding at a time, a read or a write:
// Done, Context, Err, Token, FencingToken, FencingConn and Fenced are those
// of the Lock it holds, with the lease core's guarantees, and an RWMutex is
// a fenced.ConnSource. Its methods are safe for concurrent use.
type RWMutex struct {
	c     *sskv.Client
	cfg   RWMutexConfig
	gate  *Lock
	slots []*Lock
	turn  chan struct{} // holds a token while an acquisition or release runs

	checked bool // the record matched MaxReaders; guarded by the turn

	mu     sync.Mutex
	cur    *Lock // the Lock of the latest holding: the gate or a slot
	writer bool  // cur is the gate
	closed bool
}

// NewRWMutex returns a participant of the RWMutex cfg.Name that acquires
// it through c; it sends nothing. Invalid cfg: [ErrConfig].
func NewRWMutex(c *sskv.Client, cfg RWMutexConfig) (*RWMutex, error) {
	if c == nil {
		return nil, configErr("nil sskv.Client")
	}
	if cfg.MaxReaders == 0 {
		cfg.MaxReaders = DefaultMaxReaders
	}
	if cfg.Name == "" || cfg.MaxReaders < 0 || cfg.MaxReaders > maxSemaphoreLimit {
		return nil, configErr("RWMutex Name %q, MaxReaders %d: want a name, and 1 to %d readers", cfg.Name, cfg.MaxReaders, maxSemaphoreLimit)
	}
	if cfg.MaxHold < 0 {
		return nil, configErr("negative MaxHold %v", cfg.MaxHold)
	}
	if cfg.HolderID == "" {
		cfg.HolderID = lease.DefaultHolderID(c.ID())
	}
	// The gate has no MaxHold of its own: a writer's cap starts after the
	// drain (capWrite), and a reader holds the gate only to enter.
	lc := Config{Name: RWMutexGate(cfg.Name), HolderID: cfg.HolderID, TTL: cfg.TTL, RenewInterval: cfg.RenewInterval,
		RenewDeadline: cfg.RenewDeadline, FenceKey: true, Logger: cfg.Logger, OnRenewal: cfg.OnRenewal}
	gate, err := New(c, lc)
	if err != nil {
		return nil, err
	}
	lc = gate.Config()
	cfg.TTL, cfg.RenewInterval, cfg.RenewDeadline, cfg.Logger = lc.TTL, lc.RenewInterval, lc.RenewDeadline, lc.Logger
	// cur starts as a Lock that never holds: its accessors say ErrNotHeld.
	m := &RWMutex{c: c, cfg: cfg, gate: gate, turn: make(chan struct{}, 1), cur: newLock(c, lc, lc.Logger)}
	// Slots race: only the gate's holder tries them, so there is no queue
	// to keep, and a plain key costs one request to take.
	lc.FenceKey, lc.Race, lc.MaxHold = false, true, cfg.MaxHold
	for i := range cfg.MaxReaders {
		lc.Name = RWMutexReader(cfg.Name, i)
		l, err := New(c, lc)
		if err != nil {
			return nil, err
		}
		m.slots = append(m.slots, l)
	}
	return m, nil
}

// Config returns the participant's configuration, with defaults filled in.
func (m *RWMutex) Config() RWMutexConfig { return m.cfg }

// RLock takes the lock for reading, waiting as long as ctx allows while a
// writer holds or waits for it, or MaxReaders readers hold it. Errors are
// Lock.Lock's (and ErrLimitMismatch from the record); on an error nothing
// is held.
func (m *RWMutex) RLock(ctx context.Context) error {
	_, err := m.acquire(ctx, "rlock", false, false)
	return err
}

// Lock takes the lock for writing, waiting as long as ctx allows while
// others hold it; it then holds the gate, with its token. Errors as RLock.
func (m *RWMutex) Lock(ctx context.Context) error {
	_, err := m.acquire(ctx, "lock", true, false)
	return err
}

// TryRLock is RLock without waiting: it reports false if the gate is held
// (by a writer, or by a reader entering for a moment) or every slot is.
func (m *RWMutex) TryRLock(ctx context.Context) (bool, error) {
	return m.acquire(ctx, "try rlock", false, true)
}

// TryLock is Lock without waiting: it reports false if anyone holds the
// gate or a reader slot.
func (m *RWMutex) TryLock(ctx context.Context) (bool, error) {
	return m.acquire(ctx, "try lock", true, true)
}

// errBusy ends a TryLock's look at the slots when one is held.
var errBusy = errors.New("a reader slot is held")

func (m *RWMutex) acquire(ctx context.Context, op string, write, try bool) (bool, error) {
	if err := m.begin(ctx); err != nil {
		return false, m.wrap(op, err)
	}
	defer m.end()
	switch cur := m.current(); {
	case cur.Err() == nil:
		return false, m.wrap(op, ErrAlreadyHeld)
	case errors.Is(cur.Err(), ErrLost):
		m.giveBack(ctx, cur) // a lost holding not released yet: its work has returned
	}
	if err := m.checkRecordRetrying(ctx, try); err != nil {
		return false, m.wrap(op, err)
	}
	for {
		if try {
			if ok, err := m.gate.TryLock(ctx); !ok {
				return false, m.wrapNil(op, err)
			}
		} else if err := m.gate.Lock(ctx); err != nil {
			return false, m.wrap(op, err)
		}
		var off time.Time // its connection's hold-off (lease.HoldOff), if it waits
		if !try {
			off = m.heldOffUntil()
		}
		if !write && time.Now().Before(off) {
			// Its connection came after an outage, and it may take no
			// missing slot until then: it leaves the gate to the next
			// waiters, whose connections may have none, and queues again
			// once its hold-off ends, as a Semaphore's waiter does.
			if err := m.leaveGate(ctx, off); err != nil {
				return false, m.wrap(op, err)
			}
			continue
		}
		held, err := m.gate, error(nil)
		// A wait for the slots that outlives its connection would be held
		// off on the next one: it ends with the connection, and the gate
		// is left as below.
		wctx, outage, stop := ctx, func() bool { return false }, context.CancelFunc(func() {})
		if !try {
			wctx, outage, stop = m.untilOutage(ctx)
		}
		if write {
			// A held-off writer finds the slots free, or leaves the gate
			// as a held-off reader does: its drain would wait out the
			// hold-off, and with a connection that keeps failing, for as
			// long, holding up everyone behind the gate.
			heldOff := time.Now().Before(off)
			err = m.drain(wctx, try || heldOff)
			lost := err != nil && outage()
			stop()
			if heldOff && errors.Is(err, errBusy) || lost {
				if err := m.leaveGate(ctx, m.heldOffUntil()); err != nil {
					return false, m.wrap(op, err)
				}
				continue
			}
		} else {
			held, err = m.takeSlot(wctx, try)
			lost := held == nil && outage()
			stop()
			if lost && ctx.Err() == nil {
				if err := m.leaveGate(ctx, m.heldOffUntil()); err != nil {
					return false, m.wrap(op, err)
				}
				continue
			}
		}
		if err == nil && held != nil {
			// Is the gate still ours (confirmed after a reconnect)? Then
			// the slot was taken, or the slots drained, while no other
			// writer could hold it.
			if _, _, gerr := m.gate.FencingConn(ctx); gerr != nil {
				if held != m.gate {
					m.giveBack(ctx, held)
				}
				held, err = nil, gerr
			}
		}
		gateLost := m.gate.Err() != nil
		if held != m.gate || err != nil {
			// A reader returns right after: the slot it took must be
			// left most of its renew deadline.
			m.giveBackWithin(ctx, m.gate, m.cfg.RenewDeadline/4)
		}
		switch {
		case err == nil && held != nil && m.isClosed():
			m.giveBack(ctx, held)
			return false, m.wrap(op, ErrClosed)
		case err == nil && held != nil:
			if write {
				m.capWrite()
			}
			m.mu.Lock()
			m.cur, m.writer = held, write
			m.mu.Unlock()
			return true, nil
		case errors.Is(err, errBusy) || (try && (err == nil || gateLost)):
			return false, nil
		case ctx.Err() != nil && err == nil:
			return false, m.wrap(op, context.Cause(ctx))
		case m.isClosed():
			return false, m.wrap(op, ErrClosed)
		case ctx.Err() != nil || (err != nil && !gateLost):
			return false, m.wrap(op, err)
		}
		// The gate was lost on the way in: start over.
		m.cfg.Logger.Debug("rwmutex: gate lost while entering; again", "name", m.cfg.Name, "error", err)
	}
}

// untilOutage returns a child of ctx that ends when the client's current
// connection does, and a func that reports whether it ended so.
func (m *RWMutex) untilOutage(ctx context.Context) (context.Context, func() bool, context.CancelFunc) {
	cn, err := lease.ConnNow(m.c)
	if err != nil {
		return ctx, func() bool { return false }, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-cn.Done():
			cancel(errOutage)
		case <-wctx.Done():
		}
	}()
	return wctx, func() bool { return errors.Is(context.Cause(wctx), errOutage) }, func() { cancel(nil) }
}

// errOutage ends a wait for the slots whose connection ended.
var errOutage = errors.New("lock: the connection ended")

// leaveGate gives the gate back to the waiters behind it, and waits until
// off, the end of this client's hold-off, or ctx's end.
func (m *RWMutex) leaveGate(ctx context.Context, off time.Time) error {
	m.giveBackWithin(ctx, m.gate, m.cfg.RenewDeadline/4)
	m.cfg.Logger.Debug("rwmutex: held off after a reconnect; leaving the gate to the next waiter", "name", m.cfg.Name, "until", off)
	t := time.NewTimer(time.Until(off))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// capWrite ends the gate's holding, a write holding that has just begun,
// as lost with ErrMaxHold at MaxHold from now, as a Lock's MaxHold would
// have it from its acquisition. The timer goes when the holding ends.
func (m *RWMutex) capWrite() {
	d := m.cfg.MaxHold
	if d <= 0 {
		return
	}
	m.gate.capHold(d)
}

// heldOffUntil returns when the client's current connection lets a missing
// slot be taken (lease.HoldOff); zero without a connection.
func (m *RWMutex) heldOffUntil() time.Time {
	cn, err := lease.ConnNow(m.c)
	if err != nil {
		return time.Time{}
	}
	return lease.HoldOff(cn, m.cfg.TTL)
}

// takeSlot takes a free reader slot: each once from a random one, then
// (unless try) the first to be freed, on the slots' notifications. It
// returns nil, nil if the gate is lost meanwhile. The caller holds the gate.
func (m *RWMutex) takeSlot(ctx context.Context, try bool) (*Lock, error) {
	n := len(m.slots)
	start := rand.N(n)
	for k := range n {
		l := m.slots[(start+k)%n]
		ok, err := l.TryLock(ctx)
		switch {
		case ok:
			return l, nil
		case ctx.Err() != nil || errors.Is(err, ErrNotALock) || lease.Refused(err):
			return nil, err
		}
	}
	if try {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.gate.Context(), cancel)()
	got := make(chan *Lock, n)
	errs := make(chan error, n)
	for _, l := range m.slots {
		go func() {
			if err := l.Lock(ctx); err != nil {
				errs <- err
				return
			}
			got <- l
		}()
	}
	var won *Lock
	var first error
	for range n {
		select {
		case l := <-got:
			if won == nil {
				won = l
				cancel()
			} else {
				m.giveBack(ctx, l)
			}
		case err := <-errs:
			if first == nil && won == nil && m.gate.Err() == nil {
				first = err
				cancel()
			}
		}
	}
	if won != nil {
		return won, nil
	}
	return nil, first
}

// drain returns once no reader holds a slot: each slot read missing, or
// waited for (taken, then given back). No reader takes a slot meanwhile,
// since a reader takes one only while it holds the gate, which the caller
// holds. With try, a held slot ends it with errBusy.
func (m *RWMutex) drain(ctx context.Context, try bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.gate.Context(), cancel)()
	errs := make(chan error, len(m.slots))
	for _, l := range m.slots {
		go func() {
			// A lost answer costs RenewDeadline, then a wait on the slot.
			rctx, rcancel := context.WithTimeout(ctx, m.cfg.RenewDeadline)
			res, err := m.c.Get(rctx, l.Name())
			rcancel()
			switch {
			case err == nil && !res.Found:
			case try && err == nil:
				err = errBusy
			case !try:
				if err = l.Lock(ctx); err == nil {
					m.giveBack(ctx, l)
				}
			}
			errs <- err
		}()
	}
	var first error
	for range m.slots {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// checkRecordRetrying is checkRecord, tried again with backoff, unless
// try, after a failure for want of an answer or a connection, until ctx
// ends: as Lock.Lock retries its requests.
func (m *RWMutex) checkRecordRetrying(ctx context.Context, try bool) error {
	return lease.RetryRequests(ctx, m.cfg.TTL, m.cfg.Logger.With("name", m.cfg.Name), "rwmutex: could not check the record; retrying",
		func() error { return m.checkRecord(ctx) },
		func(err error) bool {
			return try || errors.Is(err, ErrLimitMismatch) || errors.Is(err, sskv.ErrClosed) || lease.Refused(err)
		})
}

// checkRecord checks, once, that the record holds MaxReaders, writing it
// if it is missing: participants that disagree would not see each other.
// Each request waits at most RenewDeadline for its answer.
func (m *RWMutex) checkRecord(ctx context.Context) error {
	want := rwRecordPrefix + strconv.Itoa(m.cfg.MaxReaders)
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RenewDeadline)
	defer cancel()
	for i := 0; !m.checked && i < 3; i++ {
		res, err := m.c.Set(ctx, m.cfg.Name, []byte(want), sskv.SetOptions{Condition: sskv.IfNotExists})
		if err == nil && !res.Applied {
			var got sskv.GetResult
			if got, err = m.c.Get(ctx, m.cfg.Name); err == nil && got.Found && string(got.Value) != want {
				return fmt.Errorf("%w: MaxReaders %d, but the record %q holds %q", ErrLimitMismatch, m.cfg.MaxReaders, m.cfg.Name, got.Value)
			}
			res.Applied = got.Found
		}
		if err != nil {
			return fmt.Errorf("read the record: %w", err)
		}
		m.checked = res.Applied
	}
	if !m.checked {
		return errors.New("the record keeps vanishing")
	}
	return nil
}

// giveBack unlocks l, within RenewDeadline even if ctx has ended; a key it
// misses expires within its TTL.
func (m *RWMutex) giveBack(ctx context.Context, l *Lock) {
	m.giveBackWithin(ctx, l, m.cfg.RenewDeadline)
}

// giveBackWithin is giveBack within d.
func (m *RWMutex) giveBackWithin(ctx context.Context, l *Lock, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	if err := l.Unlock(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
		m.cfg.Logger.Debug("rwmutex: could not give back a key", "key", l.Name(), "error", err)
	}
}

// RUnlock ends a read holding: Lock.Unlock of its slot. Call it once the
// guarded work has returned. Without a read holding: [ErrNotHeld].
func (m *RWMutex) RUnlock(ctx context.Context) error { return m.release(ctx, "runlock", false) }

// Unlock ends a write holding: Lock.Unlock of the gate, which goes to the
// first waiter. Without a write holding: [ErrNotHeld].
func (m *RWMutex) Unlock(ctx context.Context) error { return m.release(ctx, "unlock", true) }

func (m *RWMutex) release(ctx context.Context, op string, write bool) error {
	if err := m.begin(ctx); err != nil {
		return m.wrap(op, err)
	}
	defer m.end()
	m.mu.Lock()
	l, w := m.cur, m.writer
	m.mu.Unlock()
	if w != write {
		return m.wrap(op, ErrNotHeld)
	}
	return m.wrapNil(op, l.Unlock(ctx))
}

// Close releases what is held and ends an acquisition in progress; later
// calls fail with [ErrClosed]. It is idempotent.
func (m *RWMutex) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	errs := []error{m.gate.Close(ctx)}
	for _, l := range m.slots {
		errs = append(errs, l.Close(ctx))
	}
	return m.wrapNil("close", errors.Join(errs...))
}

// Writing reports whether the current (or latest) holding is a write.
func (m *RWMutex) Writing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writer
}

// Done is [Lock.Done] for the current holding.
func (m *RWMutex) Done() <-chan struct{} { return m.Context().Done() }

// Context is [Lock.Context] for the current holding: give it to the work.
func (m *RWMutex) Context() context.Context { return m.current().Context() }

// Err is [Lock.Err] for the current holding.
func (m *RWMutex) Err() error { return m.current().Err() }

// Token is [Lock.Token] for the current (or latest) holding. A writer's is
// newer than that of every holding, read or write, that ended before it
// began; readers' tokens are not ordered against each other.
func (m *RWMutex) Token() hlc.Timestamp { return m.current().Token() }

// FencingToken is [Lock.FencingToken] for the current holding.
func (m *RWMutex) FencingToken() (hlc.Timestamp, error) { return m.current().FencingToken() }

// FencingConn is [Lock.FencingConn] for the current holding.
func (m *RWMutex) FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error) {
	return m.current().FencingConn(ctx)
}

// Fenced is [Lock.Fenced] for the current holding.
func (m *RWMutex) Fenced(token hlc.Timestamp, err error) { m.current().Fenced(token, err) }

func (m *RWMutex) current() *Lock {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

func (m *RWMutex) begin(ctx context.Context) error {
	if m.isClosed() {
		return ErrClosed
	}
	// A free turn is taken whatever ctx says, as Lock's is: an RUnlock or
	// Unlock with an ended context still releases.
	select {
	case m.turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case m.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *RWMutex) end() { <-m.turn }

func (m *RWMutex) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

func (m *RWMutex) wrap(op string, err error) error {
	return fmt.Errorf("lock: rwmutex %q: %s: %w", m.cfg.Name, op, err)
}

func (m *RWMutex) wrapNil(op string, err error) error {
	if err == nil {
		return nil
	}
	return m.wrap(op, err)
}
