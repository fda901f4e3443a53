package lock

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// The waiters of a lock queue in the order they joined, without a list or
// a scan in the store. A waiter that finds the lock held joins the queue
// with a plain SET of the lock's queue key (the lock's name and
// queueSuffix): its value is the waiter's acquisition record, and the
// version the store gives that SET orders it among the waiters. Every
// Lock that waits, holds or has just held the lock watches the queue key
// and the lock's key, so each keeps the same log: who joined, in order,
// and who has been served (taken the lock, as the lock's key shows) or has
// left (a SET of the queue key that says so).
//
// The holder hands the lock over instead of freeing it: its release writes
// the record of the longest waiter it knows into the lock's key (a
// reservation), which only that waiter's acquisition (SET NEX of the same
// record) can take, while every other SET NX fails. So a release wakes one
// waiter and sends no other to the store, and a holder that locks again at
// once joins behind the waiters. A reservation expires after a TTL if its
// waiter is gone, and the waiters after it go on.
//
// When the lock is freed without a reservation (its holder crashed, or did
// not know the queue), the first waiter in the log tries at once, and the
// others only after a grace per waiter ahead of them. A waiter that sees
// someone who joined after it served first (it was skipped, which only
// such a free-for-all allows) joins again at the back; one whose log lost
// track of the queue (a Resync) does the same.
//
// Fairness bound: once a waiter has joined, each other waiter can overtake
// it at most twice (once before a skip, once after it joins again), so no
// waiter is overtaken more than 2N times with N other waiters. Holders
// that took the lock while it was free without joining (TryLock, or a
// Lock that found it free) can take it only in the moment between a
// release and its handover, which the reservation closes for FenceKey
// locks and narrows to one round trip otherwise.

// queueSuffix is appended to a lock's name to make its queue key.
const queueSuffix = "\x00queue"

// linger is how long a Lock keeps its queue watches after a release or a
// wait, so that a Lock that locks again at once need not set them up again.
func (l *Lock) linger() time.Duration { return l.cfg.TTL }

// queueKeyOptions: the queue key carries only the latest join or leave,
// and is needed only while someone waits, so it expires (10 TTLs after the
// last, at most a day) rather than stay behind.
func (l *Lock) queueKeyOptions() sskv.SetOptions {
	return sskv.SetOptions{Expiry: min(mulSat(l.cfg.TTL, 10), 24*time.Hour)}
}

// joinEntry is one waiter in the queue.
type joinEntry struct {
	version hlc.Timestamp // of the SET that joined
	id      string        // the waiter's HolderID
	rec     []byte        // its acquisition record: what a reservation writes
}

// queue is a Lock's view of its lock's queue: the watches of the queue key
// and of the lock's key, and the log they keep.
type queue struct {
	l      *Lock
	ctx    context.Context
	cancel context.CancelFunc
	jw, lw *sskv.Watcher
	exited chan struct{}
	sig    chan struct{} // capacity 1: the state changed

	mu      sync.Mutex
	joins   []joinEntry              // joined, and neither served nor left, by version
	mine    hlc.Timestamp            // this Lock's join; zero when it is not queued
	skipped bool                     // someone who joined after this Lock was served first
	served  map[string]hlc.Timestamp // by HolderID: joins before are served
	free    bool                     // the lock's key was last seen deleted
	value   []byte                   // the lock's key's value, as last seen
	version hlc.Timestamp            // and its version
	held    bool                     // the lock's key was seen held
	unseen  time.Time                // when a Resync found missing the key seen held
	changed bool                     // the lock's key changed, or its watch lost track of it
	ended   bool
	idle    *time.Timer // ends the queue after linger, while no wait or holding uses it
}

// engage returns the Lock's queue, setting up its watches if needed. The
// caller has the turn.
func (l *Lock) engage(ctx context.Context) (*queue, error) {
	if q := l.q; q != nil && !q.over() {
		q.hold()
		return q, nil
	}
	qctx, cancel := context.WithCancel(context.WithoutCancel(l.life))
	stop := context.AfterFunc(ctx, cancel) // until set up
	defer stop()
	jw, err := l.c.Watch(qctx, l.cfg.Name+queueSuffix)
	if err != nil {
		cancel()
		return nil, err
	}
	lw, err := l.c.Watch(qctx, l.cfg.Name)
	if err != nil {
		cancel()
		return nil, err
	}
	if !stop() {
		cancel()
		return nil, ctx.Err()
	}
	q := &queue{l: l, ctx: qctx, cancel: cancel, jw: jw, lw: lw, exited: make(chan struct{}), sig: make(chan struct{}, 1)}
	go q.run()
	l.q = q
	return q, nil
}

// over reports whether the queue's watches have ended.
func (q *queue) over() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.ended
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
	if q.ended || q.idle != nil {
		return
	}
	q.idle = time.AfterFunc(q.l.linger(), q.cancel)
}

// close ends the queue's watches and waits for its goroutine.
func (q *queue) close() {
	q.cancel()
	<-q.exited
}

func (q *queue) run() {
	defer close(q.exited)
	defer func() {
		q.mu.Lock()
		q.ended = true
		q.mu.Unlock()
		q.notify()
	}()
	jev, lev := q.jw.Events(), q.lw.Events()
	for jev != nil || lev != nil {
		select {
		case ev, ok := <-jev:
			if !ok {
				return
			}
			q.applyJoin(ev)
		case ev, ok := <-lev:
			if !ok {
				return
			}
			q.applyLock(ev)
		}
	}
}

func (q *queue) notify() {
	select {
	case q.sig <- struct{}{}:
	default:
	}
}

// applyJoin logs a change of the queue key: a join or a leave.
func (q *queue) applyJoin(ev sskv.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// A Resync (the watch lost track of the queue key) carries the latest
	// join or leave: the ones before it are missed. That costs no waiter
	// its place: a waiter that a handover skips because its join was
	// missed joins again (see applyLock).
	if ev.Op != sskv.OpSet || len(ev.Value) == 0 {
		return
	}
	rec := ev.Value[1:]
	id := ParseHolder(rec, ev.Version).ID
	switch ev.Value[0] {
	case '+':
		if !q.served[id].Before(ev.Version) && !q.served[id].IsZero() {
			return // served (or left) before this notification came
		}
		for _, j := range q.joins {
			if j.version == ev.Version {
				return
			}
		}
		q.rejoined(id, ev.Version)
		q.joins = append(q.joins, joinEntry{version: ev.Version, id: id, rec: bytes.Clone(rec)})
		sortJoins(q.joins)
	case '-':
		q.remove(id, ev.Version)
		if id == q.l.cfg.HolderID {
			q.mine = hlc.Timestamp{}
		}
	}
	q.notify()
}

// remove drops the joins of id made before version, and returns the
// earliest it dropped (zero if none). q.mu is held.
func (q *queue) remove(id string, version hlc.Timestamp) (earliest hlc.Timestamp) {
	if q.served == nil {
		q.served = make(map[string]hlc.Timestamp)
	}
	if version.After(q.served[id]) {
		q.served[id] = version
	}
	kept := q.joins[:0]
	for _, j := range q.joins {
		if j.id == id && j.version.Before(version) {
			if earliest.IsZero() {
				earliest = j.version
			}
			continue
		}
		kept = append(kept, j)
	}
	clear(q.joins[len(kept):])
	q.joins = kept
	return earliest
}

// rejoined drops the joins of id before version without counting them
// served: id joined again, at the back. q.mu is held.
func (q *queue) rejoined(id string, version hlc.Timestamp) {
	kept := q.joins[:0]
	for _, j := range q.joins {
		if j.id != id || !j.version.Before(version) {
			kept = append(kept, j)
		}
	}
	clear(q.joins[len(kept):])
	q.joins = kept
}

// applyLock logs a change of the lock's key: an acquisition serves the
// acquirer's joins.
func (q *queue) applyLock(ev sskv.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.changed = true
	defer q.notify()
	if ev.Op == sskv.OpDelete {
		if ev.Resync && q.held {
			// The key may have vanished unseen (a store restart) while
			// its holder still counts on it: see Lock.
			q.unseen = time.Now()
		}
		q.free, q.value = true, nil
		return
	}
	q.free, q.held = false, true
	q.value, q.version = bytes.Clone(ev.Value), ev.Version
	h := ParseHolder(ev.Value, ev.Version)
	if h.ID == "" || bytes.Equal(ev.Value, q.l.acqRecord()) {
		return // a reservation for this Lock is not its service yet
	}
	served := q.remove(h.ID, ev.Version)
	if served.IsZero() {
		return // not a waiter of the log: a holder that did not queue
	}
	if h.ID != q.l.cfg.HolderID && !q.mine.IsZero() && served.After(q.mine) {
		q.skipped = true
	}
	if h.ID == q.l.cfg.HolderID {
		q.mine = hlc.Timestamp{}
	}
	// Waiters are served in order, so the joins before the one served are
	// done with: served already (this log missed it, in a Resync) or
	// skipped (and such a waiter joins again). Dropping them keeps a stale
	// entry from holding up the first waiter's try.
	kept := q.joins[:0]
	for _, j := range q.joins {
		if j.version.After(served) {
			kept = append(kept, j)
		} else if j.id == q.l.cfg.HolderID {
			q.skipped = true
		}
	}
	clear(q.joins[len(kept):])
	q.joins = kept
}

// queueState is what a waiter decides by.
type queueState struct {
	reserved bool          // the lock's key holds this Lock's record: it may take it
	token    hlc.Timestamp // the fencing token to take a reservation with
	unseen   time.Time     // when a Resync found missing the key seen held
	free     bool          // the lock's key was last seen deleted
	ahead    int           // live joins before this Lock's (or all, when not queued)
	queued   bool          // this Lock has a live join
	rejoin   bool          // skipped: join again
	changed  bool          // the lock's key changed since the last look
	ended    bool          // the watches ended
}

func (q *queue) state() queueState {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := queueState{
		reserved: q.value != nil && bytes.Equal(q.value, q.l.acqRecord()),
		token:    q.version,
		unseen:   q.unseen,
		free:     q.free,
		queued:   !q.mine.IsZero(),
		rejoin:   q.skipped,
		changed:  q.changed,
		ended:    q.ended,
	}
	q.changed = false
	for _, j := range q.joins {
		if s.queued && !j.version.Before(q.mine) {
			break
		}
		if j.id != q.l.cfg.HolderID {
			s.ahead++
		}
	}
	return s
}

// next returns the longest waiter in the log other than this Lock, and
// whether the log can be trusted to hand the lock over by.
func (q *queue) next() (joinEntry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return joinEntry{}, false
	}
	for _, j := range q.joins {
		if j.id != q.l.cfg.HolderID {
			return j, true
		}
	}
	return joinEntry{}, false
}

// join queues this Lock (SET of the queue key), at the back.
func (q *queue) join(ctx context.Context) error {
	l := q.l
	res, err := l.c.Set(ctx, l.cfg.Name+queueSuffix, append([]byte{'+'}, l.acqRecord()...), l.queueKeyOptions())
	if err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.rejoined(l.cfg.HolderID, res.Version)
	q.mine = res.Version
	q.skipped = false
	found := false
	for _, j := range q.joins {
		if j.version == res.Version {
			found = true
		}
	}
	if !found {
		q.joins = append(q.joins, joinEntry{version: res.Version, id: l.cfg.HolderID, rec: l.acqRecord()})
		sortJoins(q.joins)
	}
	return nil
}

// leave takes this Lock out of the queue, in the background: a waiter that
// gave up. Its join would otherwise be handed the lock, which would wait a
// TTL for it.
func (q *queue) leave() {
	q.mu.Lock()
	queued := !q.mine.IsZero()
	q.mine = hlc.Timestamp{}
	q.mu.Unlock()
	if !queued {
		return
	}
	l := q.l
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), l.cfg.TTL)
		defer cancel()
		if _, err := l.c.Set(ctx, l.cfg.Name+queueSuffix, append([]byte{'-'}, l.acqRecord()...), l.queueKeyOptions()); err != nil && !errors.Is(err, sskv.ErrClosed) {
			l.log.Debug("could not leave the queue; a release may wait a TTL for this waiter", "error", err)
		}
	}()
}

// sawHeld records that an attempt found the key held.
func (q *queue) sawHeld() {
	q.mu.Lock()
	q.held = true
	q.mu.Unlock()
}

// acquired drops this Lock's joins: it holds the lock.
func (q *queue) acquired() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.remove(q.l.cfg.HolderID, hlc.Timestamp{Wall: 1<<63 - 1})
	q.mine = hlc.Timestamp{}
	q.skipped = false
}

func sortJoins(js []joinEntry) {
	for i := len(js) - 1; i > 0 && js[i].version.Before(js[i-1].version); i-- {
		js[i], js[i-1] = js[i-1], js[i]
	}
}
