package wait

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// queue is a Lock's part in its lock's queue: the I/O around qcore (see
// queuestep.go and docs/design/queue.md). It watches the Lock's inbox and
// the roll call, feeds what they tell to qcore.step, and writes what step
// asks for; Waiter.queued runs the waiter's actions (qcore.next).
type queue struct {
	l      *lease.Lease
	ctx    context.Context
	cancel context.CancelFunc
	iw, ew *sskv.Watcher // its inbox, and the roll call
	exited chan struct{}
	sig    chan struct{} // capacity 1: the state changed
	wake   chan struct{} // capacity 1: lw changed, for run
	take   chan chan lease.KeyWatch

	mu   sync.Mutex
	idle *time.Timer // ends the queue after linger, while nothing uses it
	c    qcore
	// The watch of the lock's key, while there is one.
	lw      *sskv.Watcher
	lbox    *lease.Box         // lw's events, which a FenceKey holding's guard takes over
	lcancel context.CancelFunc // ends lw
	// ordered counts the writes of leaves and turns under way, and drained
	// is closed when it falls to zero: the next join waits for them, or
	// it could reach their receiver first, which the leave would then
	// strike, or which would forward it before the turn came (queue.md
	// W16).
	ordered int
	drained chan struct{}
}

// linger is how long a Lock keeps its queue after a release or a wait, so
// that a Lock that locks again at once need not set it up again, and so
// that what crosses its handover reaches the next holder.
func linger(cfg *lease.Config) time.Duration { return cfg.TTL }

// rollGrace is how long a Lock that took the lock without being handed the
// queue waits for the turn to come before it calls the roll.
func rollGrace(cfg *lease.Config) time.Duration {
	return min(max(cfg.TTL/5, 50*time.Millisecond), cfg.TTL)
}

// msgOptions: messages and the roll call are needed only while someone
// waits, so they expire (10 TTLs after, at most a day).
func msgOptions(cfg *lease.Config) sskv.SetOptions {
	return sskv.SetOptions{Expiry: min(mulSat(cfg.TTL, 10), 24*time.Hour)}
}

// inbox is the key of the inbox of the holder id of the lock cfg.
func inbox(cfg *lease.Config, id string) string { return cfg.Name + InboxInfix + id }

// engage returns the Lock's queue, setting up its watches if needed. The
// caller has the turn.
func (w *Waiter) engage(ctx context.Context) (*queue, error) {
	l := w.l
	if q := w.q; q != nil && !q.over() {
		q.hold()
		return q, nil
	}
	qctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel) // until set up
	defer stop()
	iw, err := l.Client().Watch(qctx, inbox(l.Config(), l.Config().HolderID))
	if err != nil {
		cancel()
		return nil, err
	}
	ew, err := l.Client().Watch(qctx, l.Config().Name+queueSuffix)
	if err != nil {
		cancel()
		return nil, err
	}
	if !stop() {
		cancel()
		return nil, ctx.Err()
	}
	q := &queue{l: l, ctx: qctx, cancel: cancel, iw: iw, ew: ew,
		exited: make(chan struct{}), sig: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		take: make(chan chan lease.KeyWatch),
		c:    qcore{self: l.Config().HolderID, ttl: l.Config().TTL, fenceKey: l.Config().FenceKey, keepWatch: !l.Config().FenceKey}}
	go q.run()
	w.q = q
	return q, nil
}

// over reports whether the queue's watches have ended.
func (q *queue) over() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.c.ended
}

// hold keeps the queue while a wait or a holding uses it.
func (q *queue) hold() {
	q.mu.Lock()
	if q.idle != nil {
		q.idle.Stop()
		q.idle = nil
	}
	q.mu.Unlock()
}

// release lets the queue end after linger unless a wait takes it again.
func (q *queue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c.ended || q.idle != nil {
		return
	}
	q.idle = time.AfterFunc(linger(q.l.Config()), q.cancel)
}

// close ends the queue's watches and waits for its goroutine.
func (q *queue) close() {
	q.cancel()
	<-q.exited
}

// step applies ev to the queue's state and writes what it asks for.
func (q *queue) step(ev qevent) {
	var rec []byte
	if ev.kind == evStart || ev.kind == evLeave {
		rec = q.l.AcqRecord()
	}
	q.mu.Lock()
	if rec != nil {
		q.c.rec = rec
	}
	out := q.c.step(time.Now(), ev)
	q.mu.Unlock()
	q.write(out)
	q.notify()
}

func (q *queue) run() {
	defer close(q.exited)
	defer func() {
		q.step(qevent{kind: evEnded})
		q.unwatchKey()
	}()
	// The queue decides by messages and changes: what the inbox and the
	// roll call held before it watched them (their watches' Initial
	// events) is from earlier queues, and the state of the lock's key
	// when its watch starts is read by the join.
	iev, eev := q.iw.Events(), q.ew.Events()
	for {
		q.mu.Lock()
		lw, lbox := q.lw, q.lbox
		q.mu.Unlock()
		var lwake <-chan struct{}
		if lw != nil {
			lwake = lbox.Wake
		}
		select {
		case ev, ok := <-iev:
			if !ok {
				return
			}
			if !ev.Initial && (ev.Op == sskv.OpSet || ev.Resync) {
				var v []byte
				if ev.Op == sskv.OpSet {
					v = ev.Value
				}
				q.step(qevent{kind: evInbox, value: v, version: ev.Version, resync: ev.Resync})
			}
		case ev, ok := <-eev:
			if !ok {
				return
			}
			if !ev.Initial && ev.Op == sskv.OpSet {
				q.step(qevent{kind: evRoll, value: ev.Value})
			}
		case <-lwake:
			evs, ended, _ := lbox.Take()
			for _, ev := range evs {
				if !ev.Initial {
					q.onLock(lw, qevent{kind: evKey, key: ev})
				}
			}
			if ended {
				q.onLock(lw, qevent{kind: evKeyEnded})
			}
		case <-q.wake:
		case reply := <-q.take:
			// Nothing reads lw's events from here on but its taker.
			q.mu.Lock()
			kw := lease.KeyWatch{W: q.lw, Cancel: q.lcancel, Box: q.lbox}
			q.lw, q.lcancel, q.lbox = nil, nil, nil
			q.mu.Unlock()
			reply <- kw
		}
	}
}

// onLock applies ev, an event of the watch lw of the lock's key, unless
// that watch was dropped since.
func (q *queue) onLock(lw *sskv.Watcher, ev qevent) {
	q.mu.Lock()
	if lw != q.lw {
		q.mu.Unlock()
		return
	}
	if ev.kind == evKeyEnded {
		q.lw = nil // ended (the service refused it after a reconnect): watch again
	}
	out := q.c.step(time.Now(), ev)
	q.mu.Unlock()
	q.write(out)
	q.notify()
}

func (q *queue) notify() {
	select {
	case q.sig <- struct{}{}:
	default:
	}
}

// write makes the writes step asked for, each in the background: a message
// lost is covered by the protocol (queue.md 6b, L7).
func (q *queue) write(out []qsend) {
	for _, s := range out {
		// Not one that waits for the Lock's turn, which the waiting Lock
		// call has: they would wait for each other.
		ordered := len(s.msg) > 0 && (s.msg[0] == msgLeave || s.msg[0] == msgTurn) && !(s.turn && !s.give.IsZero())
		if ordered {
			q.mu.Lock()
			if q.ordered++; q.ordered == 1 {
				q.drained = make(chan struct{})
			}
			q.mu.Unlock()
		}
		go func() {
			if ordered {
				defer func() {
					q.mu.Lock()
					if q.ordered--; q.ordered == 0 {
						close(q.drained)
					}
					q.mu.Unlock()
				}()
			}
			q.put(context.Background(), s, s.turn)
		}()
	}
}

// put makes the write s, within a TTL: the give-back first, with the
// Lock's turn if withTurn, then the message.
func (q *queue) put(ctx context.Context, s qsend, withTurn bool) {
	l := q.l
	ctx, cancel := context.WithTimeout(ctx, l.Config().TTL)
	defer cancel()
	if !s.give.IsZero() {
		// The key is reserved for this Lock, which no longer waits: it
		// frees it first, with the turn, since this Lock may be taking the
		// key itself (see withTurn).
		give := func() {
			if _, err := l.Client().VDel(ctx, l.Config().Name, l.AcqRecord(), sskv.DelOptions{FencingToken: s.give}); err != nil {
				l.Log().Debug("could not free the key reserved for this Lock; it expires after the TTL", "error", err)
			}
		}
		if withTurn {
			l.WithTurn(ctx, give)
		} else {
			give()
		}
	}
	if s.msg == nil {
		return
	}
	key := inbox(l.Config(), s.to)
	if s.roll {
		key = l.Config().Name + queueSuffix
	}
	// A message lost with the connection is written again once it is
	// back (a duplicate is harmless: queue.md W20), within the TTL.
	err := lease.RetryRequests(ctx, l.Config().TTL, l.Log(), "could not tell the queue; again",
		func() error { _, err := l.Client().Set(ctx, key, s.msg, msgOptions(l.Config())); return err },
		func(err error) bool {
			return !errors.Is(err, sskv.ErrNotSent) && !errors.Is(err, sskv.ErrConnectionLost) && !errors.Is(err, sskv.ErrNoAnswer)
		})
	if err != nil {
		l.Log().Debug("could not tell the queue; its waiters check again later", "to", s.to, "roll", s.roll, "error", err)
	}
}

// watchKey starts watching the lock's key.
func (q *queue) watchKey(ctx context.Context) error {
	l := q.l
	// The watch outlives the queue when a FenceKey holding takes it over
	// (see takeKeyWatch); else the queue ends it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(q.ctx))
	stop := context.AfterFunc(ctx, cancel)
	// A lost answer to the KEYNOTIFY must not keep the waiter from checking
	// for the client's RequestTimeout.
	slow := time.AfterFunc(l.Config().TTL, cancel)
	box := lease.NewBox()
	w, err := l.Client().Watch(wctx, l.Config().Name, sskv.WithCallback(box.Event, box.Done))
	slow.Stop()
	if err == nil && !stop() {
		w.Stop()
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		return err
	}
	q.mu.Lock()
	if q.c.ended {
		q.mu.Unlock()
		w.Stop()
		cancel()
		return nil
	}
	q.lw, q.lbox, q.lcancel = w, box, cancel
	q.c.step(time.Now(), qevent{kind: evWatched})
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// unwatchKey stops watching the lock's key. It does not wait for the
// store's answer to the KEYNOTIFY STOP: ending the watch's context ends it
// in the background (a new watch of the key waits for it), so that a Lock
// that has just acquired returns without that round trip.
func (q *queue) unwatchKey() {
	q.mu.Lock()
	w, cancel := q.lw, q.lcancel
	q.lw, q.lcancel, q.lbox = nil, nil, nil
	q.c.step(time.Now(), qevent{kind: evUnwatched})
	q.mu.Unlock()
	if w != nil {
		cancel()
		q.poke()
	}
}

// takeKeyWatch takes the watch of the lock's key from the queue, for a
// FenceKey holding's guard to go on with; the zero lease.KeyWatch if there is
// none. The queue's state still counts it as watching: the events that
// come meanwhile are read once giveKeyWatch gives it back.
func (q *queue) takeKeyWatch() lease.KeyWatch {
	reply := make(chan lease.KeyWatch)
	select {
	case q.take <- reply:
		return <-reply
	case <-q.exited:
		return lease.KeyWatch{}
	}
}

// giveKeyWatch gives back a watch takeKeyWatch took, when the attempt it
// was taken for failed.
func (q *queue) giveKeyWatch(kw lease.KeyWatch) {
	if kw.W == nil {
		return
	}
	q.mu.Lock()
	if q.c.ended || q.lw != nil {
		q.mu.Unlock()
		kw.W.Stop()
		kw.Cancel()
		return
	}
	q.lw, q.lcancel, q.lbox = kw.W, kw.Cancel, kw.Box
	q.mu.Unlock()
	q.poke()
}

// leaveWritten waits until the writes of this Lock's leaves and turns are
// done (or ctx ends), so that a join goes out after them.
func (q *queue) leaveWritten(ctx context.Context) error {
	q.mu.Lock()
	drained := q.drained
	if q.ordered == 0 {
		drained = nil
	}
	q.mu.Unlock()
	if drained == nil {
		return nil
	}
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next returns the waiter's next action (qcore.next).
func (q *queue) next() qaction {
	rec := q.l.AcqRecord()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.c.rec = rec
	return q.c.next(time.Now())
}

// got applies the waiter's read of the key (qcore.got).
func (q *queue) got(res sskv.GetResult) qaction {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.c.got(time.Now(), res.Found, res.Value, res.Version)
}

// attempted applies an attempt that did not take the key.
func (q *queue) attempted(a qaction, failed bool) {
	q.mu.Lock()
	q.c.attempted(a, failed)
	q.mu.Unlock()
	q.notify()
}

// joinFailed applies a join whose SET failed.
func (q *queue) joinFailed() {
	q.mu.Lock()
	q.c.joinFailed()
	q.mu.Unlock()
}

// holdUntil is when a key seen held and then found missing by a Resync may
// be taken (see Lock).
func (q *queue) holdUntil() time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.c.holdUntil
}

// heldOff applies an attempt held off by the connection's hold-off
// (evHeldOff), and makes at once the writes it asks for: the caller has
// the Lock's turn, which a give-back needs. It reports whether it handed
// the turn on.
func (q *queue) heldOff(ctx context.Context) bool {
	q.mu.Lock()
	turned := q.c.w.role == waitTurned
	out := q.c.step(time.Now(), qevent{kind: evHeldOff})
	handed := turned && q.c.w.role == waitStart
	q.mu.Unlock()
	for _, s := range out {
		q.put(ctx, s, false) // this call has the Lock's turn
	}
	q.notify()
	return handed
}

// startWait marks a wait under way.
func (q *queue) startWait() { q.step(qevent{kind: evStart}) }

// acquired makes this Lock the queue's keeper: it holds the lock. partial:
// it took a key whose holder went without handing the queue over; it calls
// the roll unless a turn comes within rollGrace.
func (q *queue) acquired(partial bool, token hlc.Timestamp) {
	q.step(qevent{kind: evAcquired, partial: partial, token: token})
	if q.l.Config().FenceKey {
		q.unwatchKey() // the holding's guard took it over (takeKeyWatch)
	}
	if partial {
		time.AfterFunc(rollGrace(q.l.Config()), func() { q.step(qevent{kind: evRollDue}) })
	}
}

// handOver ends this Lock's keeping of the queue, at a release: it returns
// the first waiter, if there is one.
func (q *queue) handOver() (first entry, ok bool) {
	q.mu.Lock()
	out := q.c.step(time.Now(), qevent{kind: evRelease})
	first, ok = q.c.handTo, q.c.keeper == keepReleasing
	q.mu.Unlock()
	q.write(out)
	return first, ok
}

// sendTurn hands the queue to its first waiter, after the release, with
// the reservation's version (zero without one).
func (q *queue) sendTurn(token hlc.Timestamp) { q.step(qevent{kind: evTurnOut, token: token}) }

// handOnKept hands on the queue this Lock still keeps from a holding that
// ended without a release that handed it over (lost, or Unlock could not
// reach the store): its first waiter is sent the turn, as after a release.
// The caller has the turn, and the Lock does not hold.
func (q *queue) handOnKept() { q.step(qevent{kind: evKeptLost}) }

// leave ends this Lock's wait without the lock: it tells the Lock it
// joined, or hands on the queue it was handed.
func (q *queue) leave() {
	q.step(qevent{kind: evLeave})
	q.unwatchKey()
}
