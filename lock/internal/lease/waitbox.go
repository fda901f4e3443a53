package lease

import (
	"sync"
	"time"

	"github.com/dsslock/dsslock/sskv"
)

// Box is what a racing waiter (package wait) sleeps on: one channel, woken
// by its watch of the key and by its timers. A waiter so blocks on two
// channels (the box and its context) whatever it waits for, and its watch
// is a callback watch, with no channel or goroutine of its own: an election
// has followers by the thousand, each asleep while its leader renews.
//
// The watch's events queue in the box until the waiter takes them, in
// order. A FenceKey holding that the wait ends in takes the watch over
// (handoff): the events the waiter had not taken, then those that follow,
// go to the holding's guard.
type Box struct {
	Wake chan struct{} // capacity 1: a wake-up is pending

	mu    sync.Mutex
	evs   []sskv.Event // events the waiter has not taken; nil when none
	ended bool         // the watch ended (its done was called)
	fired Timers       // the timers that fired since the waiter last looked

	// to is the holding that has taken the watch over: its events and its
	// end go to its guard (judge, guardEnded).
	to *holding
}

// Timers is a set of a waiter's Timers.
type Timers uint8

const (
	RecheckTimer Timers = 1 << iota // the safeguard recheck, after recheckAfter
	DelayTimer                      // a retry's or a lost race's delay
	HoldTimer                       // the end of a hold-off
)

// NewBox returns an empty Box.
func NewBox() *Box {
	return &Box{Wake: make(chan struct{}, 1)}
}

// Poke wakes the waiter, unless a wake-up is pending.
func (b *Box) Poke() {
	select {
	case b.Wake <- struct{}{}:
	default:
	}
}

// Event is the watch's callback.
func (b *Box) Event(ev sskv.Event) {
	b.mu.Lock()
	if b.to != nil {
		// Under b.mu, so that it follows the events handoff passed on.
		b.to.judge(ev)
		b.mu.Unlock()
		return
	}
	b.evs = append(b.evs, ev)
	b.mu.Unlock()
	b.Poke()
}

// Done is the watch's callback for its end, called after its last event.
func (b *Box) Done(err error) {
	b.mu.Lock()
	if h := b.to; h != nil {
		b.mu.Unlock()
		h.guardEnded(err)
		return
	}
	b.ended = true
	b.mu.Unlock()
	b.Poke()
}

// Fire records that timer t fired, and wakes the waiter. A timer reset
// as it fires may wake the waiter once too often: the waiter then checks
// the lock early, which is harmless.
func (b *Box) Fire(t Timers) {
	b.mu.Lock()
	b.fired |= t
	b.mu.Unlock()
	b.Poke()
}

// Arm has timer t fire after d: it resets tm, or makes it if it is nil.
func (b *Box) Arm(tm *time.Timer, t Timers, d time.Duration) *time.Timer {
	if tm == nil {
		return time.AfterFunc(d, func() { b.Fire(t) })
	}
	tm.Reset(d)
	return tm
}

// Take returns what happened since the waiter last looked: the watch's
// events, whether it has ended, and the timers that fired.
func (b *Box) Take() (evs []sskv.Event, ended bool, fired Timers) {
	b.mu.Lock()
	defer b.mu.Unlock()
	evs, ended, fired = b.evs, b.ended, b.fired
	b.evs, b.ended, b.fired = nil, false, 0
	return evs, ended, fired
}

// handoff hands the watch over to h's guard, with the events the waiter
// had not taken, and reports true; or reports false, and changes nothing,
// if the watch has ended. h.judge is called under b.mu: it ends the watch
// only in the background (KeyWatch.end), which calls done after.
func (b *Box) handoff(h *holding) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return false
	}
	b.to = h
	for _, ev := range b.evs {
		h.judge(ev)
	}
	b.evs = nil
	return true
}
