package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// SemaphoreConfig configures a [Semaphore]. Name is required; Limit is
// required unless the semaphore's record exists already. TTL,
// RenewInterval, RenewDeadline, Logger and OnRenewal mean what they mean in
// [Config], and apply to each slot the participant holds.
type SemaphoreConfig struct {
	// Name is the semaphore's record key; slot i is SemaphoreSlot(Name, i).
	Name string
	// Limit is how many may hold the semaphore at once, at most 1000. The
	// first participant to find no record writes it (SET NX, no expiry);
	// the record rules from then on (else ErrLimitMismatch). Zero: take
	// the record's (ErrNoLimit if there is none).
	Limit int
	// HolderID is this participant's id in each slot it holds.
	HolderID                          string
	TTL, RenewInterval, RenewDeadline time.Duration
	// MaxHold caps each holding of a slot, as Config.MaxHold caps a
	// Lock's: at MaxHold it ends as lost (ErrMaxHold) even while renewed.
	MaxHold   time.Duration
	Logger    *slog.Logger
	OnRenewal func(latency time.Duration, err error)
}

// slotInfix is put between a semaphore's name and a slot number to make the
// slot's key, as the queue (package wait) makes its extra keys.
const slotInfix = "\x00slot\x00"

// gateSuffix is appended to a semaphore's name to make its gate's key (see
// semwait.go).
const gateSuffix = "\x00gate"

// semaphoreRecordPrefix starts the value of a semaphore's record key.
const semaphoreRecordPrefix = lease.SemaphoreRecordPrefix

// maxSemaphoreLimit bounds Limit: an acquisition that finds the slots held
// has tried each of them, and the gate's holder watches each (see
// semwait.go).
const maxSemaphoreLimit = 1000

// SemaphoreSlot returns the key of slot i of the semaphore name.
func SemaphoreSlot(name string, i int) string { return name + slotInfix + strconv.Itoa(i) }

// SemaphoreRecord returns the value of the record of a semaphore of limit
// n, as NewSemaphore's participants write it.
func SemaphoreRecord(n int) []byte { return []byte(semaphoreRecordPrefix + strconv.Itoa(n)) }

// parseSemaphoreRecord returns the limit a record holds.
func parseSemaphoreRecord(v []byte) (int, bool) {
	s, ok := strings.CutPrefix(string(v), semaphoreRecordPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxSemaphoreLimit || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}

// Semaphore is one participant of a counting semaphore: at most Limit
// participants hold it at once, each in a slot of its own. Create it with
// [NewSemaphore]; acquire with [Semaphore.TryAcquire] or
// [Semaphore.Acquire]; release with [Semaphore.Release]. Each slot is a key
// held by a FenceKey Lock, so leases, renewals, fencing
// and release are a Lock's: Done, Context, Err, Token, FencingToken,
// FencingConn and Fenced refer to the current (or latest) holding, and a
// Semaphore is a fenced.ConnSource. Its methods are safe for concurrent
// use.
//
// Waiters queue on a gate, a Lock of its own, and the one holding the gate
// takes the next slot freed (see Acquire). While the participant holding
// the gate is paused, the other waiters wait until its lease of the gate
// ends (TTL), even if slots are freed meanwhile.
//
// A participant that acquires again within a TTL of its last holding or
// wait watches the semaphore's record, rather than read it at each
// acquisition, until a TTL after it last held or waited, or until Close.
type Semaphore struct {
	c    *sskv.Client
	cfg  SemaphoreConfig
	log  *slog.Logger
	turn chan struct{} // holds a token while an acquisition or release runs
	life context.Context
	kill context.CancelCauseFunc

	gate  *Lock   // the waiters' queue (semwait.go)
	slots []*Lock // one per slot of the largest limit seen; guarded by the turn
	// lastActive is when it last released, or waited; guarded by the turn.
	lastActive time.Time
	// rec watches the record while the participant is active, and idle
	// ends it a TTL after the turn was last taken (see recordWatch);
	// recOff: the service refused the watch, the record is read each
	// time. Guarded by the turn.
	rec    *recordWatch
	idle   *time.Timer
	recOff bool

	mu sync.Mutex
	// idling is closed when the idle timer's look at the record's watch
	// (idleEnd), which may hold the turn for a moment, is over; nil when
	// none runs.
	idling chan struct{}
	cur    *Lock // the slot of the latest holding; nil before the first
	slot   int   // its number; -1 before the first
	limit  int   // the record's limit, as last read (cfg.Limit before)
	closed bool
}

// NewSemaphore returns a participant of the semaphore cfg.Name that
// acquires it through c; it sends nothing. Invalid cfg: [ErrConfig].
func NewSemaphore(c *sskv.Client, cfg SemaphoreConfig) (*Semaphore, error) {
	if c == nil {
		return nil, configErr("nil sskv.Client")
	}
	if cfg.Limit < 0 || cfg.Limit > maxSemaphoreLimit {
		return nil, configErr("semaphore Limit %d: want 1 to %d, or 0 to take the record's", cfg.Limit, maxSemaphoreLimit)
	}
	// Config checks the rest, as it will for each slot.
	lc, err := Config{
		Name:          cfg.Name,
		HolderID:      cfg.HolderID,
		TTL:           cfg.TTL,
		RenewInterval: cfg.RenewInterval,
		RenewDeadline: cfg.RenewDeadline,
		MaxHold:       cfg.MaxHold,
		Logger:        cfg.Logger,
	}.withDefaults(c.ID())
	if err != nil {
		return nil, err
	}
	cfg.HolderID, cfg.TTL, cfg.RenewInterval, cfg.RenewDeadline, cfg.Logger = lc.HolderID, lc.TTL, lc.RenewInterval, lc.RenewDeadline, lc.Logger
	if err := checkWatchable(c, SemaphoreSlot(cfg.Name, maxSemaphoreLimit-1), cfg.HolderID); err != nil {
		return nil, err
	}
	gate, err := New(c, Config{
		Name:          cfg.Name + gateSuffix,
		HolderID:      cfg.HolderID,
		TTL:           cfg.TTL,
		RenewInterval: cfg.RenewInterval,
		RenewDeadline: cfg.RenewDeadline,
		// A release reserves the gate for the first waiter: nobody takes
		// it in between (see package wait's queue.go), nor sees it free (gateFree).
		FenceKey: true,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	s := &Semaphore{
		c:     c,
		cfg:   cfg,
		log:   cfg.Logger,
		turn:  make(chan struct{}, 1),
		gate:  gate,
		slot:  -1,
		limit: cfg.Limit,
	}
	if s.log.Handler() != slog.DiscardHandler {
		s.log = s.log.With("semaphore", cfg.Name, "holder", cfg.HolderID)
	}
	s.life, s.kill = context.WithCancelCause(context.Background())
	return s, nil
}

// Name returns the semaphore's record key.
func (s *Semaphore) Name() string { return s.cfg.Name }

// HolderID returns the id of this participant.
func (s *Semaphore) HolderID() string { return s.cfg.HolderID }

// Config returns the participant's configuration, with defaults filled in.
func (s *Semaphore) Config() SemaphoreConfig { return s.cfg }

// Limit returns the semaphore's limit as this participant last read it from
// the record, or Config.Limit before its first acquisition.
func (s *Semaphore) Limit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// Slot returns the slot of the current (or latest) holding, 0 to Limit-1;
// -1 before the first acquisition.
func (s *Semaphore) Slot() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slot
}

// TryAcquire tries each slot once and reports whether it took one; all
// held is not an error. Errors: ErrLimitMismatch or ErrNoLimit from the
// record (nothing tried), else the first of TryLock's if no slot was taken.
func (s *Semaphore) TryAcquire(ctx context.Context) (bool, error) {
	ctx, unbind := s.bind(ctx)
	defer unbind()
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	defer s.end()
	for {
		n, told, err := s.prepare(ctx)
		if err != nil {
			return false, err
		}
		ok, err := s.tryAll(ctx, n, told, rand.N(n))
		switch {
		case ok:
			return true, nil
		case errors.Is(err, errRecordChanged):
			continue // the slot taken is released: read the record again
		}
		return false, s.fail(ctx, "try acquire", err)
	}
}

// Acquire takes a slot of the semaphore, waiting as long as ctx allows
// while Limit others hold it. When it returns nil, this participant holds
// one slot (Slot), with at least RenewDeadline before it could be lost.
//
// A participant that has neither held nor waited within a TTL, or that
// finds nobody at the semaphore's gate, tries each slot once. Otherwise,
// or if every slot is held, it queues on the gate, first come first
// served, even for the slot it just freed (see semwait.go). Errors are
// Lock.Lock's, and ErrLimitMismatch or ErrNoLimit from the record; on an
// error, nothing is held.
func (s *Semaphore) Acquire(ctx context.Context) error {
	ctx, unbind := s.bind(ctx)
	defer unbind()
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.end()
	for {
		err := s.acquire(ctx)
		if !errors.Is(err, errRecordChanged) {
			return err
		}
		s.log.Debug("the semaphore's record changed while a slot was taken; released it, and reading the record again")
	}
}

// acquire is one pass of Acquire; errRecordChanged: do it again. The caller
// has the turn.
func (s *Semaphore) acquire(ctx context.Context) error {
	fresh := !s.active()
	var gateFree chan bool
	if !fresh {
		// Read the gate while prepare reads the record.
		gateFree = make(chan bool, 1)
		go func() { gateFree <- s.gateFree(ctx) }()
	}
	n, told, err := s.prepareWaiting(ctx)
	if err != nil {
		return err
	}
	if fresh || <-gateFree {
		// Not at the gate lately, or nobody waits there: try each slot
		// once, from a random one. A participant that held or waited
		// within a TTL, and finds someone at the gate, queues behind them
		// instead, rather than take a slot its release just freed.
		ok, err := s.tryAll(ctx, n, told, rand.N(n))
		switch {
		case ok:
			return nil
		case errors.Is(err, errRecordChanged):
			return err
		case err != nil && stops(ctx, err):
			return s.fail(ctx, "acquire", err)
		}
	}
	if err := s.acquireGated(ctx, n, told); err != nil {
		if errors.Is(err, errRecordChanged) {
			return err
		}
		return s.fail(ctx, "acquire", err)
	}
	return nil
}

// active reports whether the participant released, or waited, within a
// TTL. The caller has the turn.
func (s *Semaphore) active() bool {
	return !s.lastActive.IsZero() && time.Since(s.lastActive) <= s.cfg.TTL
}

// tryAll tries slots start, start+1, ... (mod n) once each until one is
// taken, under the limit n (told: as the record's watch told it, see
// keep). It returns the first error if none was. The caller has the turn.
func (s *Semaphore) tryAll(ctx context.Context, n int, told bool, start int) (bool, error) {
	var first error
	for k := range n {
		i := (start + k) % n
		ok, err := s.slots[i].tryLock(ctx) // TryLock without its read of a held key
		if ok {
			if err := s.keep(ctx, i, n, told); err != nil {
				return false, err
			}
			return true, nil
		}
		if err != nil {
			if first == nil {
				first = err
			}
			if ctx.Err() != nil || lease.Refused(err) || errors.Is(err, ErrClosed) {
				break
			}
		}
	}
	return false, first
}

// prepare reads (or creates) the record, checks that this participant
// agrees with its limit, makes sure the slots' Locks exist and that none
// is held. It returns the limit, and whether the record's watch told it
// (see keep). The caller has the turn.
func (s *Semaphore) prepare(ctx context.Context) (int, bool, error) {
	if cur := s.current(); cur != nil && cur.held() {
		return 0, false, s.wrap("", ErrAlreadyHeld)
	}
	n, told, err := s.readLimit(ctx)
	if err != nil {
		return 0, false, s.fail(ctx, "", err)
	}
	for i := len(s.slots); i < n; i++ {
		l, err := New(s.c, Config{
			Name:          SemaphoreSlot(s.cfg.Name, i),
			HolderID:      s.cfg.HolderID,
			TTL:           s.cfg.TTL,
			RenewInterval: s.cfg.RenewInterval,
			RenewDeadline: s.cfg.RenewDeadline,
			MaxHold:       s.cfg.MaxHold,
			FenceKey:      true,
			OnRenewal:     s.cfg.OnRenewal,
			Logger:        s.cfg.Logger,
		})
		if err != nil {
			return 0, false, err
		}
		s.slots = append(s.slots, l)
	}
	return n, told, nil
}

// prepareWaiting is prepare for Acquire: a read of the record that fails
// for want of an answer or a connection is tried again, with backoff, until
// ctx ends, as Lock.Lock retries its requests.
func (s *Semaphore) prepareWaiting(ctx context.Context) (int, bool, error) {
	var n int
	var told bool
	err := lease.RetryRequests(ctx, s.cfg.TTL, s.log, "could not read the semaphore's record; retrying",
		func() (err error) {
			n, told, err = s.prepare(ctx)
			return err
		},
		func(err error) bool {
			return errors.Is(err, ErrAlreadyHeld) || errors.Is(err, ErrLimitMismatch) ||
				errors.Is(err, ErrNoLimit) || errors.Is(err, sskv.ErrClosed) || lease.Refused(err)
		})
	if err != nil && err == ctx.Err() { // ended while it waited to retry
		return 0, false, s.fail(ctx, "", err)
	}
	return n, told, err
}

// limitError: a participant's Limit differs from the record's.
type limitError struct{ want, record int }

func (e *limitError) Error() string {
	return fmt.Sprintf("%v: this participant's Limit is %d, the semaphore's record says %d (delete the record while nobody holds the semaphore to change it)", ErrLimitMismatch, e.want, e.record)
}

func (e *limitError) Unwrap() error { return ErrLimitMismatch }

// Release is [Lock.Unlock] for the slot held, which goes to the first
// waiter, if any. Call it only once the guarded work has returned.
func (s *Semaphore) Release(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.end()
	cur := s.current()
	if cur == nil {
		return s.wrap("release", ErrNotHeld)
	}
	s.lastActive = time.Now()
	return s.fail(ctx, "", cur.Unlock(ctx))
}

// Close releases the slot held (as Release) and ends an acquisition in
// progress; later calls fail with [ErrClosed]. It is idempotent.
func (s *Semaphore) Close(ctx context.Context) error {
	s.kill(ErrClosed)
	if err := s.begin(ctx); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil
		}
		return err
	}
	defer s.end()
	s.stopRecordWatch()
	if s.idle != nil {
		s.idle.Stop()
	}
	errs := []error{s.gate.Close(ctx)}
	for _, l := range s.slots {
		errs = append(errs, l.Close(ctx))
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return errors.Join(errs...)
}

// Done is [Lock.Done] for the current holding.
func (s *Semaphore) Done() <-chan struct{} { return s.Context().Done() }

// Context is [Lock.Context] for the current holding: give it to the work.
func (s *Semaphore) Context() context.Context {
	if l := s.current(); l != nil {
		return l.Context()
	}
	return lease.NotHeldContext()
}

// Err is [Lock.Err] for the current holding.
func (s *Semaphore) Err() error {
	if l := s.current(); l != nil {
		return l.Err()
	}
	return ErrNotHeld
}

// Token is [Lock.Token] for the current (or latest) holding. Tokens of
// different slots are not ordered against each other.
func (s *Semaphore) Token() hlc.Timestamp {
	if l := s.current(); l != nil {
		return l.Token()
	}
	return hlc.Timestamp{}
}

// FencingToken is [Lock.FencingToken] for the current holding.
func (s *Semaphore) FencingToken() (hlc.Timestamp, error) {
	if l := s.current(); l != nil {
		return l.FencingToken()
	}
	return hlc.Timestamp{}, s.wrap("", ErrNotHeld)
}

// FencingConn is [Lock.FencingConn] for the current holding.
func (s *Semaphore) FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error) {
	if l := s.current(); l != nil {
		return l.FencingConn(ctx)
	}
	return hlc.Timestamp{}, nil, s.wrap("", ErrNotHeld)
}

// Fenced is [Lock.Fenced] for the current holding.
func (s *Semaphore) Fenced(token hlc.Timestamp, err error) {
	if l := s.current(); l != nil {
		l.Fenced(token, err)
	}
}

func (s *Semaphore) current() *Lock {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// setHolding records the holding of slot i. The caller has the turn.
func (s *Semaphore) setHolding(i int) {
	s.mu.Lock()
	s.cur, s.slot = s.slots[i], i
	s.mu.Unlock()
	s.log.Info("acquired a slot", "slot", i, "token", s.slots[i].Token())
}

// bind returns ctx, also ended by Close (with cause ErrClosed).
func (s *Semaphore) bind(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.life, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
	}
}

// closedErr is ErrClosed in place of err when Close ended ctx.
func (s *Semaphore) closedErr(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrClosed) && !errors.Is(err, ErrClosed) {
		return fmt.Errorf("%w (%w)", ErrClosed, err)
	}
	return err
}

// fail returns err (nil if nil) with the semaphore's name, and ErrClosed
// in its place if Close ended ctx.
func (s *Semaphore) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if se := (*semError)(nil); errors.As(err, &se) {
		return s.closedErr(ctx, err)
	}
	return s.wrap(op, s.closedErr(ctx, err))
}

// begin takes the participant's turn for an acquisition or release.
func (s *Semaphore) begin(ctx context.Context) error {
	if s.isClosed() {
		return s.wrap("", ErrClosed)
	}
	// A free turn is taken whatever ctx says, as Lock's is: a Release
	// with an ended context still releases.
	select {
	case s.turn <- struct{}{}:
	default:
		select {
		case s.turn <- struct{}{}:
		case <-ctx.Done():
			// The idle timer holds the turn only for a moment: that is
			// waited out all the same.
			s.mu.Lock()
			idling := s.idling
			s.mu.Unlock()
			if idling != nil {
				<-idling
			}
			select {
			case s.turn <- struct{}{}:
			default:
				return s.wrap("", ctx.Err())
			}
		}
	}
	if s.isClosed() {
		<-s.turn
		return s.wrap("", ErrClosed)
	}
	return nil
}

// end gives the turn back, and has the watch of the record, if any, end a
// TTL after it unless the turn is taken again (see idleEnd).
func (s *Semaphore) end() {
	if s.rec != nil {
		if s.idle == nil {
			s.idle = time.AfterFunc(s.cfg.TTL, s.idleEnd)
		} else {
			s.idle.Reset(s.cfg.TTL)
		}
	}
	<-s.turn
}

func (s *Semaphore) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// wrap adds the semaphore's name, and op if not empty, to err.
func (s *Semaphore) wrap(op string, err error) error {
	return &semError{name: s.cfg.Name, op: op, err: err}
}

type semError struct {
	name, op string
	err      error
}

func (e *semError) Error() string {
	op := ""
	if e.op != "" {
		op = e.op + ": "
	}
	msg := e.err.Error()
	// A slot's Lock names its key: say the semaphore's name once.
	if i := strings.Index(msg, `": `); strings.HasPrefix(msg, "lock \"") && i > 0 {
		msg = msg[i+3:]
	}
	return fmt.Sprintf("semaphore %q: %s%s", e.name, op, strings.TrimPrefix(msg, "lock: "))
}

func (e *semError) Unwrap() error { return e.err }
