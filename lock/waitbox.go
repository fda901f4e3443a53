package lock

import (
	"sync"
	"time"

	"github.com/dsslock/dsslock/sskv"
)

// waitBox is what a racing waiter (Lock.wait) sleeps on: one channel, woken
// by its watch of the key and by its timers. A waiter so blocks on two
// channels (the box and its context) whatever it waits for, and its watch
// is a callback watch, with no channel or goroutine of its own: an election
// has followers by the thousand, each asleep while its leader renews.
//
// The watch's events queue in the box until the waiter takes them, in
// order. A FenceKey holding that the wait ends in takes the watch over
// (handoff): the events the waiter had not taken, then those that follow,
// go to the holding's guard.
type waitBox struct {
	wake chan struct{} // capacity 1: a wake-up is pending

	mu    sync.Mutex
	evs   []sskv.Event // events the waiter has not taken; nil when none
	ended bool         // the watch ended (its done was called)
	fired timers       // the timers that fired since the waiter last looked

	// to is the holding that has taken the watch over: its events and its
	// end go to its guard (judge, guardEnded).
	to *holding
}

// timers is a set of a waiter's timers.
type timers uint8

const (
	recheckTimer timers = 1 << iota // the safeguard recheck, after recheckAfter
	delayTimer                      // a retry's or a lost race's delay
	holdTimer                       // the end of a hold-off
)

func newWaitBox() *waitBox {
	return &waitBox{wake: make(chan struct{}, 1)}
}

// poke wakes the waiter, unless a wake-up is pending.
func (b *waitBox) poke() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// event is the watch's callback.
func (b *waitBox) event(ev sskv.Event) {
	b.mu.Lock()
	if b.to != nil {
		// Under b.mu, so that it follows the events handoff passed on.
		b.to.judge(ev)
		b.mu.Unlock()
		return
	}
	b.evs = append(b.evs, ev)
	b.mu.Unlock()
	b.poke()
}

// done is the watch's callback for its end, called after its last event.
func (b *waitBox) done(err error) {
	b.mu.Lock()
	if h := b.to; h != nil {
		b.mu.Unlock()
		h.guardEnded(err)
		return
	}
	b.ended = true
	b.mu.Unlock()
	b.poke()
}

// fire records that timer t fired, and wakes the waiter. A timer reset
// as it fires may wake the waiter once too often: the waiter then checks
// the lock early, which is harmless.
func (b *waitBox) fire(t timers) {
	b.mu.Lock()
	b.fired |= t
	b.mu.Unlock()
	b.poke()
}

// arm has timer t fire after d: it resets tm, or makes it if it is nil.
func (b *waitBox) arm(tm *time.Timer, t timers, d time.Duration) *time.Timer {
	if tm == nil {
		return time.AfterFunc(d, func() { b.fire(t) })
	}
	tm.Reset(d)
	return tm
}

// take returns what happened since the waiter last looked: the watch's
// events, whether it has ended, and the timers that fired.
func (b *waitBox) take() (evs []sskv.Event, ended bool, fired timers) {
	b.mu.Lock()
	defer b.mu.Unlock()
	evs, ended, fired = b.evs, b.ended, b.fired
	b.evs, b.ended, b.fired = nil, false, 0
	return evs, ended, fired
}

// handoff hands the watch over to h's guard, with the events the waiter
// had not taken, and reports true; or reports false, and changes nothing,
// if the watch has ended. h.judge is called under b.mu: it ends the watch
// only in the background (waitWatch.end), which calls done after.
func (b *waitBox) handoff(h *holding) bool {
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
