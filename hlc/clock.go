package hlc

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Option configures a Clock created by NewClock.
type Option func(*Clock)

// WithMaxDrift sets how far ahead of the physical clock a timestamp may be
// before Update and CheckDrift reject it with ErrDrift. The limit is applied
// in whole milliseconds (d is truncated). A d <= 0 selects DefaultMaxDrift.
func WithMaxDrift(d time.Duration) Option {
	return func(c *Clock) {
		if d <= 0 {
			d = DefaultMaxDrift
		}
		c.maxDrift = d
	}
}

// WithWallClock makes the Clock read physical time from now instead of
// time.Now, typically to inject a controllable clock in tests. The Clock
// calls now while holding its lock, so now must not call back into the
// Clock. A nil now selects time.Now.
func WithWallClock(now func() time.Time) Option {
	return func(c *Clock) {
		if now == nil {
			now = time.Now
		}
		c.now = now
	}
}

// WithFloor makes every value the Clock issues greater than every timestamp
// whose Wall is at most wall, whatever the physical clock reads: a process
// that saved a bound on the walls of the timestamps it issued restarts its
// clock above them, even if its physical clock stepped back meanwhile. Until
// the physical clock passes wall, the Clock runs ahead of it (and Update
// fails with ErrDrift while that is more than MaxDrift). A wall <= 0 sets no
// floor.
func WithFloor(wall int64) Option {
	return func(c *Clock) {
		if wall > 0 {
			c.last = Timestamp{Wall: wall, Counter: MaxCounter, Node: c.node}
		}
	}
}

// Clock is a hybrid logical clock issuing timestamps for one node. It is safe
// for concurrent use; every value it returns from Now or Update is strictly
// greater than every value it returned before.
//
// A Clock must be created with NewClock; the zero Clock is not usable.
type Clock struct {
	node     string
	maxDrift time.Duration
	now      func() time.Time

	mu   sync.Mutex
	last Timestamp // last value issued; the zero Timestamp before the first
}

// NewClock returns a Clock for the given node id, which becomes the Node of
// every timestamp the Clock issues. It returns an error wrapping ErrMalformed
// if node is not a valid node id (empty, or containing ':' or an ASCII
// control character).
func NewClock(node string, opts ...Option) (*Clock, error) {
	if err := ValidateNode(node); err != nil {
		return nil, err
	}
	c := &Clock{node: node, maxDrift: DefaultMaxDrift, now: time.Now}
	for _, opt := range opts {
		opt(c)
	}
	return c, nil
}

// Node returns the node id of the timestamps c issues.
func (c *Clock) Node() string { return c.node }

// MaxDrift returns how far ahead of the physical clock a timestamp may be
// before c rejects it.
func (c *Clock) MaxDrift() time.Duration { return c.maxDrift }

// Peek returns the value most recently issued by Now or Update, without
// ticking the clock. It returns the zero Timestamp if c has issued nothing
// yet.
func (c *Clock) Peek() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Now ticks the clock for a local or send event and returns the new value.
// If the physical clock has moved past the wall of the last value, the
// result is (physical time, 0); otherwise it keeps the last wall and
// increments the counter. If that counter would exceed MaxCounter, Now
// instead advances the wall by one millisecond and resets the counter to 0,
// running slightly ahead of the physical clock until it catches up.
//
// Now never fails and does not check drift: it only moves ahead of the
// physical clock as far as earlier Updates took it, plus the rare overflow
// millisecond.
func (c *Clock) Now() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	phys := c.physical()
	next := Timestamp{Wall: c.last.Wall, Counter: c.last.Counter + 1, Node: c.node}
	switch {
	case phys > c.last.Wall:
		next.Wall, next.Counter = phys, 0
	case c.last.Counter >= MaxCounter:
		if c.last.Wall == math.MaxInt64 {
			// 292 million years after the epoch: only reachable with an
			// absurd injected wall clock.
			panic("hlc: clock exhausted: wall and counter at their maximum")
		}
		next.Wall, next.Counter = c.last.Wall+1, 0
	}
	c.last = next
	return next
}

// Update merges remote, a timestamp received from another node (or from this
// one), into the clock for a receive event and returns the new value. With
// local the last value issued and phys the physical time:
//
//   - phys ahead of both walls: (phys, 0);
//   - equal walls: (wall, max(local counter, remote counter)+1);
//   - local wall ahead: (local wall, local counter+1);
//   - remote wall ahead: (remote wall, remote counter+1).
//
// If that counter would exceed MaxCounter, Update moves on as Now does: the
// wall advances by one millisecond and the counter restarts at 0. A counter
// near its maximum therefore never stops the clock; it only runs a
// millisecond further ahead of the physical clock.
//
// The result, whose Node is c.Node(), is strictly greater than both local and
// remote. Update fails, leaving the clock unchanged, with an error wrapping
//
//   - ErrMalformed if remote is not valid (see Timestamp.Validate);
//   - ErrDrift if the result's wall is more than MaxDrift ahead of phys. This
//     rejects a remote too far in the future, and also any update while a
//     backwards step of the physical clock leaves c itself that far ahead;
//   - ErrOverflow only if the wall itself is exhausted (math.MaxInt64
//     milliseconds), which no real clock reaches.
func (c *Clock) Update(remote Timestamp) (Timestamp, error) {
	if err := remote.Validate(); err != nil {
		return Timestamp{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	phys := c.physical()
	local := c.last
	var wall int64
	var counter uint64
	switch {
	case phys > local.Wall && phys > remote.Wall:
		wall, counter = phys, 0
	case local.Wall == remote.Wall:
		wall, counter = local.Wall, uint64(max(local.Counter, remote.Counter))+1
	case local.Wall > remote.Wall:
		wall, counter = local.Wall, uint64(local.Counter)+1
	default:
		wall, counter = remote.Wall, uint64(remote.Counter)+1
	}
	if counter > MaxCounter {
		if wall == math.MaxInt64 {
			return Timestamp{}, fmt.Errorf("%w: merging %s into %s", ErrOverflow, remote, local)
		}
		wall, counter = wall+1, 0
	}
	if err := c.checkDrift(wall, phys); err != nil {
		return Timestamp{}, err
	}
	c.last = Timestamp{Wall: wall, Counter: uint32(counter), Node: c.node}
	return c.last, nil
}

// CheckDrift returns an error wrapping ErrDrift, and saying how far ahead t
// is, if t.Wall is more than MaxDrift ahead of the physical clock; otherwise
// it returns nil. It neither validates t nor changes the clock. Update makes
// the same check on its result; CheckDrift serves timestamps that are
// compared rather than merged, such as fencing tokens.
func (c *Clock) CheckDrift(t Timestamp) error {
	c.mu.Lock()
	phys := c.physical()
	c.mu.Unlock()
	return c.checkDrift(t.Wall, phys)
}

// physical reads the wall clock in milliseconds. Call with c.mu held, so that
// readings are taken in the order values are issued.
func (c *Clock) physical() int64 { return c.now().UnixMilli() }

func (c *Clock) checkDrift(wall, phys int64) error {
	if wall <= phys {
		return nil
	}
	ahead := uint64(wall) - uint64(phys) // exact: both are int64s and wall > phys
	if ahead <= uint64(c.maxDrift.Milliseconds()) {
		return nil
	}
	if ahead > math.MaxInt64/uint64(time.Millisecond) {
		return fmt.Errorf("%w: %d ms ahead, more than the %v allowed", ErrDrift, ahead, c.maxDrift)
	}
	return fmt.Errorf("%w: %v ahead, more than the %v allowed",
		ErrDrift, time.Duration(ahead)*time.Millisecond, c.maxDrift)
}
