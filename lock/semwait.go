package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// Waiting for a semaphore's slot.
//
// Every waiter of a semaphore waits in one queue, slot 0's, as a Lock's
// waiters wait (see queue.go), so that they are served in the order they
// came, whichever slot is released:
//
//   - Slot 0 goes to the first waiter by the queue's turn, as a Lock's key.
//   - The other slots keep no queue: their holders release them with a
//     plain VDEL. The holder of slot 0, which keeps the queue, watches them
//     while anyone waits (the keeper). When one is freed, it reserves it for
//     its first waiter (SET NX of the waiter's acquisition record, with the
//     TTL), takes that waiter out of the queue and tells it (msgSlot). The
//     waiter stops waiting for slot 0 and takes the reserved slot, as a
//     Lock takes a key reserved for it. A reservation that no waiter takes
//     (it left, or its process died) is deleted by the participant it was
//     for, or expires, and the keeper offers the slot to the next.
//   - A holder of slot 0 that keeps no queue (it took a free slot without
//     waiting) does not confirm its waiters' joins. Those waiters watch the
//     other slots themselves once a grace has passed without a
//     confirmation, and take one that is freed, as a Lock's waiters take a
//     key whose holder keeps no queue.
//
// So a waiter sends no request while the holders renew, and only the
// keeper and the two waiters that watch slot 0's key get notifications of
// renewals.

// offer is a slot reserved for this participant by the keeper.
type offer struct {
	slot    int
	version hlc.Timestamp
}

// acquireQueued waits in slot 0's queue for a slot of n, as above. The
// caller has the turn.
func (s *Semaphore) acquireQueued(ctx context.Context, n int) error {
	l0 := s.slots[0]
	if n == 1 {
		if err := l0.Lock(ctx); err != nil {
			return err
		}
		s.setHolding(0, n)
		return nil
	}
	offers := make(chan offer, 4)
	s.omu.Lock()
	s.offers = offers
	s.omu.Unlock()
	defer func() {
		s.lastActive = time.Now()
		s.omu.Lock()
		s.offers = nil
		s.omu.Unlock()
		for {
			select {
			case o := <-offers:
				s.decline(o)
			default:
				return
			}
		}
	}()
	cv, timer := s.newCover(n), stoppedTimer()
	defer cv.stop()
	defer timer.Stop()
	for {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- l0.Lock(wctx) }()
		// stop ends the wait for slot 0; it reports whether slot 0 was
		// taken all the same.
		stop := func() bool {
			cancel()
			cv.stop()
			return <-done == nil
		}
	wait:
		for {
			select {
			case err := <-done:
				cancel()
				if err != nil {
					return err
				}
				s.setHolding(0, n)
				return nil
			case o := <-offers:
				if o.slot >= n {
					s.decline(o)
					continue
				}
				if stop() {
					s.decline(o)
					s.setHolding(0, n)
					return nil
				}
				ok, err := s.slots[o.slot].tryLock(ctx, o.version)
				if ok {
					s.setHolding(o.slot, n)
					return nil
				}
				s.decline(o)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// The reservation is gone (it expired before this waiter
				// came to it), or could not be taken yet: wait again.
				s.log.Debug("a slot reserved for this participant was gone; waiting again", "slot", o.slot, "error", err)
				break wait
			case <-s.slots[0].sem.waitSig:
			case <-cv.sig:
			case <-timer.C:
			}
			pl := l0.queuePlace()
			if !pl.waiting || pl.turn || !pl.joined || pl.acked {
				// Not in the queue yet, or in it and served by the
				// keeper, or slot 0 is released to it.
				cv.stop()
				continue
			}
			// Joined, but not confirmed: after a grace, the holder of slot
			// 0 keeps no queue, and this waiter watches the other slots.
			// The grace is long enough for a confirmation delayed on a
			// loaded machine: a waiter that takes another slot while its
			// turn for slot 0 comes must hand that turn on, which costs
			// more than the wait.
			if wait := time.Until(pl.joinedAt.Add(l0.coverGrace())); wait > 0 {
				timer.Reset(wait)
				continue
			}
			if err := cv.start(ctx); err != nil {
				s.log.Debug("cannot watch the other slots; waiting for slot 0 only", "error", err)
				cv.stop()
				continue
			}
			j, next := cv.tryFreed(ctx)
			if j > 0 {
				if stop() {
					// Slot 0 came too: hand it to the next waiter.
					uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.TTL)
					if err := l0.Unlock(uctx); err != nil {
						s.log.Debug("could not release slot 0, taken with another", "error", err)
					}
					ucancel()
				}
				s.setHolding(j, n)
				return nil
			}
			if !next.IsZero() {
				timer.Reset(time.Until(next))
			}
		}
	}
}

// offered takes an offer from the keeper: to the acquisition under way, if
// any, else declined.
func (s *Semaphore) offered(slot int, version hlc.Timestamp) {
	o := offer{slot, version}
	s.omu.Lock()
	if s.offers != nil {
		select {
		case s.offers <- o:
			s.omu.Unlock()
			return
		default:
		}
	}
	s.omu.Unlock()
	s.decline(o)
}

// decline deletes a reservation of a slot for this participant, which it
// does not take.
func (s *Semaphore) decline(o offer) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.TTL)
	defer cancel()
	if l := s.slotLock(o.slot); l != nil {
		// With the slot Lock's turn: the offer may have come late, its
		// reservation expired, and this participant may be taking the slot
		// itself, with the same record (see Lock.withTurn).
		l.withTurn(ctx, func() { s.dropOffered(ctx, o) })
		return
	}
	s.dropOffered(ctx, o) // a slot beyond the limit: this participant never tries it
}

// dropOffered deletes the reservation of an offer that is declined.
func (s *Semaphore) dropOffered(ctx context.Context, o offer) {
	key := SemaphoreSlot(s.cfg.Name, o.slot)
	// A reservation is fenced (see reserve): the VDEL carries the
	// reservation's version, newer than the reservation's token. The
	// record it names is the one of an acquisition under way, never a
	// holder's. This participant's own attempts on the slot cannot write
	// it while the reservation lasts; once it has expired (a late offer),
	// they can, and the caller's turn of the slot's Lock keeps the VDEL
	// out of their two-SET window.
	if _, err := s.c.VDel(ctx, key, s.slots0Record(), sskv.DelOptions{FencingToken: o.version}); err != nil {
		s.log.Debug("could not delete a reservation of a slot; it expires after the TTL", "slot", o.slot, "error", err)
	}
}

// keep serves the semaphore's queue while this participant holds slot 0
// of n: it offers the other slots to the first waiter as they are freed.
// It returns when ctx ends.
func (s *Semaphore) keep(ctx context.Context, n int) {
	l0 := s.slots[0]
	cv, timer := s.newCover(n), stoppedTimer()
	defer cv.stop()
	defer timer.Stop()
	for {
		if _, ok := l0.firstWaiter(); !ok {
			cv.stop() // nobody waits: nothing to watch for
		} else if err := cv.start(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("cannot watch the other slots; the queue waits for slot 0", "error", err)
			cv.stop()
			timer.Reset(l0.queueGrace())
		} else if next := cv.offerFreed(ctx, l0); !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return
		case <-l0.sem.keepSig:
		case <-cv.sig:
		case <-timer.C:
		}
	}
}

// cover is a watch of slots 1 to n-1, by the keeper or by a waiter whose
// holder keeps no queue.
type cover struct {
	s   *Semaphore
	n   int
	sig chan struct{} // capacity 1: a slot changed

	ws []*sskv.Watcher // while watching; the watches of slots 1 to n-1

	mu        sync.Mutex
	ended     bool        // a watch ended: set them up again
	pending   []bool      // the slot was freed (or never looked at): try it
	notBefore []time.Time // no attempt before: its key may be held in someone's belief
	seenHeld  []bool
}

func (s *Semaphore) newCover(n int) *cover {
	return &cover{s: s, n: n, sig: make(chan struct{}, 1)}
}

// stoppedTimer returns a timer that has not been started.
func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

func (cv *cover) signal() {
	select {
	case cv.sig <- struct{}{}:
	default:
	}
}

// start watches the slots, unless it does. Each watch's first event, the
// slot's state, marks a free slot to be tried: one freed before the watch
// would send nothing.
func (cv *cover) start(ctx context.Context) error {
	cv.mu.Lock()
	ended := cv.ended
	cv.mu.Unlock()
	if ended {
		cv.stop()
	}
	if cv.ws != nil {
		return nil
	}
	cv.mu.Lock()
	cv.ended = false
	cv.pending = make([]bool, cv.n)
	cv.notBefore = make([]time.Time, cv.n)
	cv.seenHeld = make([]bool, cv.n)
	cv.mu.Unlock()
	ws := make([]*sskv.Watcher, 0, cv.n-1)
	for j := 1; j < cv.n; j++ {
		w, err := cv.s.c.Watch(ctx, SemaphoreSlot(cv.s.cfg.Name, j), sskv.WithCallback(
			func(ev sskv.Event) { cv.onEvent(j, ev) },
			func(error) {
				cv.mu.Lock()
				cv.ended = true
				cv.mu.Unlock()
				cv.signal()
			}))
		if err != nil {
			for _, w := range ws {
				w.Stop()
			}
			return err
		}
		ws = append(ws, w)
	}
	cv.ws = ws
	return nil
}

// stop ends the watches.
func (cv *cover) stop() {
	ws := cv.ws
	cv.ws = nil
	for _, w := range ws {
		w.Stop()
	}
}

func (cv *cover) onEvent(j int, ev sskv.Event) {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	if cv.pending == nil {
		return
	}
	if ev.Op == sskv.OpSet {
		cv.pending[j], cv.seenHeld[j] = false, true
		return
	}
	cv.pending[j] = true
	if ev.Resync && cv.seenHeld[j] {
		// Found missing after notifications were lost: it may have
		// vanished unseen (a store restart) while its holder still counts
		// on it, as Lock.wait reasons.
		cv.notBefore[j] = time.Now().Add(cv.s.cfg.TTL)
	}
	cv.signal()
}

// due returns the slots to try now, clearing their marks, the connection
// whose hold-off (see Lock.holdOff) they were checked against, and when the
// next one is due (zero: at the next change). Without a connection (ctx
// ended, or the client closed), none is due.
func (cv *cover) due(ctx context.Context) (slots []int, cn *sskv.Conn, next time.Time) {
	cn, err := cv.s.c.Connection(ctx)
	if err != nil {
		return nil, nil, time.Time{}
	}
	holdOff := cv.s.slots[0].holdOff(cn)
	now := time.Now()
	cv.mu.Lock()
	defer cv.mu.Unlock()
	off := rand.N(cv.n - 1)
	for k := range cv.n - 1 {
		j := 1 + (off+k)%(cv.n-1)
		if !cv.pending[j] {
			continue
		}
		at := cv.notBefore[j]
		if holdOff.After(at) {
			at = holdOff
		}
		if now.Before(at) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		cv.pending[j] = false
		slots = append(slots, j)
	}
	return slots, cn, next
}

// retry marks slot j to be tried again at t.
func (cv *cover) retry(j int, t time.Time) {
	cv.mu.Lock()
	defer cv.mu.Unlock()
	cv.pending[j] = true
	if t.After(cv.notBefore[j]) {
		cv.notBefore[j] = t
	}
	cv.signal()
}

// tryFreed tries the slots that are due with TryLock, and returns the one
// it took, or 0 and when to look again (zero: at the next change).
func (cv *cover) tryFreed(ctx context.Context) (int, time.Time) {
	slots, _, next := cv.due(ctx) // TryLock checks its own connection's hold-off
	for _, j := range slots {
		l := cv.s.slots[j]
		ok, err := l.tryLock(ctx, hlc.Timestamp{}) // TryLock without its read of a held key
		if ok {
			return j, time.Time{}
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) && !refused(err) {
			cv.retry(j, time.Now().Add(l.queueGrace())) // a timeout or a lost connection
		}
	}
	return 0, next
}

// offerFreed reserves each slot that is due for the first waiter of l0's
// queue, and tells that waiter, until the slots or the waiters run out. It
// returns when to look again (zero: at the next change).
func (cv *cover) offerFreed(ctx context.Context, l0 *Lock) time.Time {
	slots, cn, next := cv.due(ctx)
	for i, j := range slots {
		first, ok := l0.firstWaiter()
		if !ok {
			for _, j := range slots[i:] {
				cv.retry(j, time.Time{})
			}
			break
		}
		if err := cv.s.reserve(ctx, cn, l0, j, first); err != nil {
			if ctx.Err() != nil {
				break
			}
			cv.s.log.Debug("could not reserve a slot for the first waiter", "slot", j, "error", err)
			cv.retry(j, time.Now().Add(l0.queueGrace()))
		}
	}
	return next
}

// reserve reserves slot j for the waiter first, if it is free, takes first
// out of l0's queue and tells it. Once begun, it goes on past ctx's end
// (for a TTL at most): a SET whose answer was not awaited may have
// reserved the slot, for a waiter nobody would tell.
//
// The reservation goes out on cn, the connection whose hold-off found the
// slot due (see cover.due), or not at all: sent on a later connection,
// after a store restart, it could reserve a slot that vanished while its
// holder still counts on it, and the waiter takes a slot reserved for it
// without a hold-off of its own (see Lock.reservedOn).
func (s *Semaphore) reserve(ctx context.Context, cn *sskv.Conn, l0 *Lock, j int, first entry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.TTL)
	defer cancel()
	key := SemaphoreSlot(s.cfg.Name, j)
	// The reservation is fenced, with this holder's token of slot 0: the
	// waiter's own attempts on the slot (a TryAcquire after it stopped
	// waiting, say) write the very record reserved for it, and so would
	// take the reservation unfenced, and the unfenced VDEL that gives an
	// untaken reservation back could then delete the key between the two
	// SETs of such an acquisition, for a third participant to take it too.
	// Fenced, only the waiter's take of the offer (fenced with the
	// reservation's version, which is newer) can take it, and a give-back
	// fenced with the older token is refused once it has.
	ft := l0.Token()
	if ft.IsZero() {
		return errors.New("this participant does not hold slot 0")
	}
	res, err := cn.Set(ctx, key, first.rec, sskv.SetOptions{Condition: sskv.IfNotExists, Expiry: s.cfg.TTL, FencingToken: ft})
	if err != nil || !res.Applied {
		return err // held: its release or expiry will tell
	}
	// If the waiter left meanwhile, or this participant is releasing slot 0
	// and hands the queue on, it is told all the same: it takes the slot
	// if it still waits, or else declines the offer and so deletes the
	// reservation, with its slot Lock's turn (see decline). A VDEL from
	// here could not be ordered with the waiter's own attempts on the
	// slot: sent on a path that froze, it could reach the store after the
	// reservation expired and the waiter's own acquisition had recreated
	// the key with the same record, without a token yet, and delete it
	// between that acquisition's two SETs.
	served := l0.served(first.id)
	if _, err := s.c.Set(ctx, l0.inbox(first.id), offerBody(j, res.Version), l0.msgOptions()); err != nil {
		// Not told: the reservation expires after the TTL, and the slot
		// goes to the next waiter then.
		return err
	}
	if !served {
		return errors.New("the first waiter is no longer this holder's; it was told, to take the slot or give it back")
	}
	return nil
}
