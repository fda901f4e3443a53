package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/lock/internal/wait"
	"github.com/dsslock/dsslock/sskv"
)

// Waiting for a semaphore's slot.
//
// The waiters of a semaphore queue on its gate: a Lock of its own, on the
// key name+gateSuffix, whose waiters are served in the order they came
// (see package wait's queue.go). Only the participant holding the gate looks for a slot:
// it watches the slots' keys (the first event of each watch is the key's
// state), takes a slot it sees free with the slot Lock's TryLock, then
// leaves the gate (Unlock), which goes to the next waiter. Apache
// Curator's InterProcessSemaphoreV2 uses a mutex as a gate the same way.
// The gate has FenceKey: its release reserves it for the first waiter, so
// that nobody takes it in between, nor reads it free (Acquire tries the
// slots at once when it finds nobody at the gate).
//
// The gate holds nothing but the order. The slots are taken with their
// Locks' SET NEX, so nothing that befalls the gate (a holder of it paused
// or cut off, its lease lost, two holders of it after a store restart)
// can put more than Limit holders in the slots. A participant that loses
// the gate while it waits goes on waiting for a slot, beside the next
// holder of the gate.
//
// Costs: the waiters behind the gate send nothing while the holders renew,
// as any Lock's waiters; the one holding the gate renews the gate (one
// request per RenewInterval) and is told of the slots' renewals. While it
// is paused, the others wait until its lease of the gate ends (TTL), even
// if slots are freed meanwhile.
//
// Nobody takes a slot that someone may still believe they hold: a slot
// found free is not tried within a TTL of a reconnect (TryLock holds off:
// see lease.HoldOff), nor within a TTL of a Resync that found it missing
// after it was seen held (it may have vanished unseen with a store restart
// while its holder still counts on it), as a racing waiter (package wait) reasons. A gate
// holder held off after a reconnect while a slot is free leaves the gate
// to the next waiters, whose connections may have had no outage, and
// queues again once its hold-off has ended.

// gateFree reports whether a read finds nobody at the gate.
//
// A lost answer costs at most RenewDeadline, and counts as someone there.
func (s *Semaphore) gateFree(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewDeadline)
	defer cancel()
	res, err := s.c.Get(rctx, s.gate.Name())
	return err == nil && !res.Found
}

// acquireGated takes a slot of n through the gate: it queues on the gate,
// and holding it, takes the first slot it sees free. told: n is the limit
// the record's watch told (see keep). The caller has the turn.
func (s *Semaphore) acquireGated(ctx context.Context, n int, told bool) error {
	defer func() { s.lastActive = time.Now() }()
	for {
		if err := s.gate.Lock(ctx); err != nil {
			return err
		}
		j, err := s.waitSlot(ctx, n)
		// On success too, at once: the next waiter's turn.
		s.leaveGate(ctx)
		var ho heldOff
		if !errors.As(err, &ho) {
			if err != nil {
				return err
			}
			return s.keep(ctx, j, n, told)
		}
		// A slot is free, but this participant's connection came after an
		// outage, and it may take none until its hold-off ends (see
		// lease.HoldOff): the next waiters, whose connections may have
		// none, are not held up meanwhile. It queues again once its
		// hold-off has ended.
		s.log.Debug("held off after a reconnect; leaving the gate to the next waiter", "until", time.Time(ho))
		t := time.NewTimer(time.Until(time.Time(ho)))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// heldOff is waitSlot's error when it sees a slot free that its
// participant may not take before then.
type heldOff time.Time

func (heldOff) Error() string { return "lock: held off after a reconnect" }

// leaveGate releases the gate, whatever ctx says (for a TTL at most): a
// gate left held would hold the next waiter up until it expired.
//
// The release waits at most a quarter of RenewDeadline: Acquire returns
// after it, and the slot just taken must be left most of its renew
// deadline. A gate not released in time expires after its TTL.
func (s *Semaphore) leaveGate(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RenewDeadline/4)
	defer cancel()
	if err := s.gate.Unlock(uctx); err != nil && !errors.Is(err, ErrNotHeld) {
		s.log.Debug("could not release the gate; it expires after the TTL", "error", err)
	}
}

// stops reports whether err, from an attempt on ctx, ends an acquisition
// rather than being retried.
func stops(ctx context.Context, err error) bool {
	return ctx.Err() != nil || lease.Refused(err) || errors.Is(err, ErrClosed) || errors.Is(err, sskv.ErrClosed)
}

// waitSlot watches slots 0 to n-1 and takes one as soon as it is seen free,
// and returns it. It tries none before its watch reports the slot free:
// whoever comes to the gate has mostly found every slot held, and the
// watches' first events tell which are free without a try of each. A slot
// free while the participant is held off after a reconnect ends the wait
// (heldOff). The caller has the turn and holds the gate.
func (s *Semaphore) waitSlot(ctx context.Context, n int) (int, error) {
	sw := &slotWatch{
		sig:       make(chan struct{}, 1),
		pending:   make([]bool, n),
		seenHeld:  make([]bool, n),
		notBefore: make([]time.Time, n),
	}
	defer sw.stop()
	ttl := s.cfg.TTL
	retry := lease.NewBackoff(max(ttl/100, time.Millisecond), max(ttl/4, time.Millisecond))
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	recheck := time.NewTimer(wait.RecheckAfter(ttl))
	defer recheck.Stop()
	watch := true
	for {
		if watch {
			watch = false
			// Its first events, the slots' states, mark the free ones.
			if err := sw.start(ctx, s, n); err != nil {
				if stops(ctx, err) {
					return -1, err
				}
				s.log.Debug("cannot watch the slots; retrying", "error", err)
				timer.Reset(retry.NextBackOff())
			} else {
				retry.Reset()
			}
		}
		if sw.ws != nil && sw.collect(ttl) {
			// A watch ended (the service refused it after a reconnect):
			// watch again.
			s.log.Debug("a watch of the slots ended; watching again")
			sw.stop()
			timer.Reset(retry.NextBackOff())
		}
		if sw.ws != nil {
			cn, err := s.c.Connection(ctx)
			if err != nil {
				return -1, err
			}
			off := lease.HoldOff(cn, ttl)
			due, next := sw.due(off)
			if len(due) == 0 && time.Now().Before(off) && slices.Contains(sw.pending, true) {
				return -1, heldOff(off)
			}
			again := false
			for _, j := range due {
				ok, err := sw.try(ctx, s.slots[j], j)
				switch {
				case ok:
					return j, nil
				case err != nil && stops(ctx, err):
					return -1, err
				case err != nil:
					// A timeout or a lost connection: try it again soon.
					s.log.Debug("could not try a free slot; retrying", "slot", j, "error", err)
					sw.retry(j, time.Now().Add(wait.QueueGrace(s.cfg.TTL)))
					again = true
				default:
					// Held: its release or expiry will tell. Or held off
					// by a reconnect since cn, which tells nothing if the
					// slot stayed free: look again after the hold-off.
					if cn2, err := s.c.Connection(ctx); err == nil && cn2 != cn {
						if off := lease.HoldOff(cn2, ttl); time.Now().Before(off) {
							sw.retry(j, off)
							again = true
						}
					}
				}
			}
			if again {
				continue
			}
			if !next.IsZero() {
				timer.Reset(time.Until(next))
			}
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-sw.sig:
		case <-timer.C:
			watch = sw.ws == nil
		case <-recheck.C:
			// The safeguard: a notification lost unseen cannot keep the
			// slots from this waiter for longer.
			for j := range sw.pending {
				sw.pending[j] = true
			}
			recheck.Reset(wait.RecheckAfter(ttl))
		}
	}
}

// slotWatch is the gate holder's watch of the slots, owned by waitSlot:
// a callback watch of each slot, whose events queue in a waitBox as a
// racing waiter's do, so that the holding of a slot taken goes on with
// the slot's watch (see holding.guard).
type slotWatch struct {
	sig chan struct{} // capacity 1: a watch has news

	ws    []*sskv.Watcher // nil while not watching; ws[j] nil once a holding took it over
	boxes []*lease.Box

	pending   []bool      // seen free: try it
	seenHeld  []bool      // seen held, since the wait began
	notBefore []time.Time // no attempt before: the slot may be held in someone's belief
}

func (sw *slotWatch) signal() {
	select {
	case sw.sig <- struct{}{}:
	default:
	}
}

// start watches slots 0 to n-1 of s. ctx bounds only the registrations:
// a holding that takes a slot goes on with its watch.
func (sw *slotWatch) start(ctx context.Context, s *Semaphore, n int) error {
	ws := make([]*sskv.Watcher, n)
	boxes := make([]*lease.Box, n)
	var g errgroup.Group
	g.SetLimit(32) // a semaphore may have up to maxSemaphoreLimit slots
	for j := range n {
		box := lease.NewBox()
		boxes[j] = box
		g.Go(func() error {
			w, err := s.c.Watch(ctx, SemaphoreSlot(s.cfg.Name, j), sskv.WithCallback(
				func(ev sskv.Event) { box.Event(ev); sw.signal() },
				func(err error) { box.Done(err); sw.signal() }), sskv.Detached())
			ws[j] = w
			return err
		})
	}
	if err := g.Wait(); err != nil {
		for _, w := range ws {
			if w != nil {
				w.Stop()
			}
		}
		return err
	}
	sw.ws, sw.boxes = ws, boxes
	return nil
}

// stop ends the watches but those a holding took over.
func (sw *slotWatch) stop() {
	for _, w := range sw.ws {
		if w != nil {
			w.Stop()
		}
	}
	sw.ws, sw.boxes = nil, nil
}

// collect takes what the watches told, and reports whether one ended. A
// slot found missing by a Resync (or by a watch started again) after it was
// seen held may have vanished unseen while its holder still counts on it:
// it is not tried for a TTL.
func (sw *slotWatch) collect(ttl time.Duration) (ended bool) {
	for j, b := range sw.boxes {
		evs, end, _ := b.Take()
		ended = ended || end
		for _, ev := range evs {
			if ev.Op == sskv.OpSet {
				sw.pending[j], sw.seenHeld[j] = false, true
				continue
			}
			sw.pending[j] = true
			if (ev.Resync || ev.Initial) && sw.seenHeld[j] {
				sw.notBefore[j] = time.Now().Add(ttl)
			}
		}
	}
	return ended
}

// try is slot Lock l's TryLock (without its read of a held key) of slot j,
// with j's watch for the holding to go on with (as racer.attempt hands a
// racing waiter's): a new watch of the key would share the registration of
// j's, and start from the latest state this client was told, which may not
// show the acquisition yet.
func (sw *slotWatch) try(ctx context.Context, l *Lock, j int) (bool, error) {
	ok, taken, err := l.tryLockWatching(ctx, lease.KeyWatch{W: sw.ws[j], Box: sw.boxes[j]})
	if taken {
		sw.ws[j] = nil
	}
	return ok, err
}

// due returns the slots to try now, from a random one, clearing their
// marks, and when the next one is due (zero: at the next change). No slot
// is due before holdOff.
func (sw *slotWatch) due(holdOff time.Time) (slots []int, next time.Time) {
	now := time.Now()
	n := len(sw.pending)
	off := rand.N(n)
	for k := range n {
		j := (off + k) % n
		if !sw.pending[j] {
			continue
		}
		at := sw.notBefore[j]
		if holdOff.After(at) {
			at = holdOff
		}
		if now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		sw.pending[j] = false
		slots = append(slots, j)
	}
	return slots, next
}

// retry marks slot j to be tried again at t.
func (sw *slotWatch) retry(j int, t time.Time) {
	sw.pending[j] = true
	if t.After(sw.notBefore[j]) {
		sw.notBefore[j] = t
	}
}
