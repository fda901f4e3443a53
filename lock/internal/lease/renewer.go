package lease

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsslock/dsslock/internal/clientlocal"
	"github.com/dsslock/dsslock/sskv"
)

// renewer renews all the holdings of the Locks of one sskv.Client. It keeps
// them in a heap ordered by when each needs attention next (its renewal, or
// its renew deadline while a renewal is under way), and runs one goroutine,
// only while some holding lasts, that sleeps on one timer until the first of
// them. Renewals due go to a pool of at most maxRenewWorkers goroutines,
// which exist only while renewals wait or are in flight: renewals are
// pipelined on the client's connection and a slow one holds up no other.
// An idle holding costs an entry in the heap: no goroutine and no timer.
//
// When more renewals are due than the pool takes at once (every holding
// after a reconnect, each a GET that confirms its key and then its SET),
// they wait in order of their renew deadlines, and a worker takes a
// holding's confirmation and renewal together: the holdings closest to
// their deadlines are renewed first, rather than all of them near the end
// of the burst.
//
// Every guarantee of a holding is its own: its renew deadline is checked on
// the monotonic clock when the heap says it has come (and by every
// FencingToken), and losing one holding affects no other.
type renewer struct {
	c    *sskv.Client
	Wake chan struct{} // capacity 1: the heap changed

	mu      sync.Mutex
	queue   renewHeap
	ready   readyHeap  // holdings due, waiting for a worker, by renew deadline
	workers int        // worker goroutines running (at most maxRenewWorkers)
	running bool       // run is running
	busy    int        // renewals waiting for a worker or in flight
	conn    *sskv.Conn // a connection the holdings write on, watched for its loss
}

// maxRenewWorkers bounds the renewals (or confirmations and renewals) of
// one client in flight at once: a quarter of the local store's Receive
// Maximum, leaving room for other requests. It is reached only by a burst,
// such as every holding after a reconnect.
const maxRenewWorkers = 256

// renewerKey is the key of a client's renewer (internal/clientlocal).
type renewerKey struct{}

// renewerOf returns the renewer of c.
func renewerOf(c *sskv.Client) *renewer {
	return clientlocal.Of(c).Get(renewerKey{}, func() any {
		return &renewer{c: c, Wake: make(chan struct{}, 1)}
	}).(*renewer)
}

// add schedules h, just acquired by a SET sent at sent, for its first
// renewal: at a random point of the second half of its renew interval, so
// that locks taken together do not renew together.
func (r *renewer) add(h *holding, sent time.Time) {
	iv := h.l.cfg.RenewInterval
	r.mu.Lock()
	h.renewAt = sent.Add(iv/2 + rand.N(iv/2+1))
	h.due = h.renewAt
	if h.pokeReq || lost(h.conn) {
		h.due = time.Now()
	}
	heap.Push(&r.queue, h)
	if r.conn == nil || lost(r.conn) {
		r.conn = h.conn
	}
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		go r.run()
	} else {
		r.kick()
	}
}

// remove takes h out of the schedule; it has ended.
func (r *renewer) remove(h *holding) {
	r.mu.Lock()
	if h.index >= 0 {
		heap.Remove(&r.queue, h.index)
	}
	r.mu.Unlock()
	r.kick()
}

// poke has h confirm its key now (see holding.askConfirm).
func (r *renewer) poke(h *holding) {
	r.mu.Lock()
	h.pokeReq = true
	if !h.busy && h.index >= 0 {
		h.due = time.Now()
		heap.Fix(&r.queue, h.index)
	}
	r.mu.Unlock()
	r.kick()
}

func (r *renewer) kick() {
	select {
	case r.Wake <- struct{}{}:
	default:
	}
}

// run serves the heap until it is empty and no renewal is in flight.
func (r *renewer) run() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		if len(r.queue) == 0 && r.busy == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		now := time.Now()
		var due []*holding
		// Renewals due within a batch window go out together: the store
		// and the connection handle a burst of requests for less than the
		// same requests one by one. Deadlines are checked on time.
		for len(r.queue) > 0 {
			h := r.queue[0]
			window := min(h.l.cfg.RenewInterval/batchWindowDiv, maxBatchWindow)
			if !h.due.Before(h.expiry()) {
				window = 0 // a renew deadline is checked on time, not early
			}
			if h.due.After(now.Add(window)) || (h.due.After(now) && h.busy) {
				break
			}
			due = append(due, heap.Pop(&r.queue).(*holding))
		}
		for _, h := range due {
			r.attend(h, later(now, h.due))
		}
		if len(due) > 0 {
			r.mu.Unlock()
			continue
		}
		wait := time.Hour
		if len(r.queue) > 0 {
			wait = r.queue[0].due.Sub(now)
		}
		var connLost <-chan struct{}
		if r.conn != nil {
			connLost = r.conn.Done()
		}
		r.mu.Unlock()

		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-r.Wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-connLost:
			r.connectionLost()
		case <-r.c.Done():
			r.closed()
			return
		}
	}
}

// attend handles h, whose time has come (now: its due time, if it was
// taken early for a batch), and puts it back in the heap unless it ended.
// Whether the renew deadline has passed is decided on the clock, never on
// now: a holding taken out of the heap must be lost, or go back in.
// r.mu is held.
func (r *renewer) attend(h *holding, now time.Time) {
	expires := h.expiry()
	switch {
	case !h.live():
		return
	case !time.Now().Before(expires):
		// The renew deadline has passed: lost, whatever is in flight.
		go h.deadline()
		return
	case h.busy || !now.Before(expires):
		// A renewal is in flight, or one would start too late to matter:
		// the next thing due is the deadline.
		h.due = expires
	default:
		h.busy = true
		r.busy++
		h.due = expires // the deadline, while the renewal waits or is in flight
		h.confirmOnly = h.pokeReq && now.Before(h.renewAt)
		h.pokeReq = false
		h.readyBy = expires
		heap.Push(&r.ready, h)
		if r.workers < maxRenewWorkers {
			r.workers++
			go r.worker()
		}
	}
	heap.Push(&r.queue, h)
}

// worker renews the holdings due, the one with the earliest renew deadline
// first, until none waits.
func (r *renewer) worker() {
	for {
		r.mu.Lock()
		if len(r.ready) == 0 {
			r.workers--
			if cap(r.ready) > maxRenewWorkers {
				r.ready = nil // a burst's room is not kept
			}
			r.mu.Unlock()
			return
		}
		h := heap.Pop(&r.ready).(*holding)
		confirmOnly := h.confirmOnly
		r.mu.Unlock()
		r.work(h, confirmOnly)
	}
}

// connectionLost has every holding whose connection was lost renew (after
// confirming its key) as soon as the next connection is up.
func (r *renewer) connectionLost() {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conn = nil
	for _, h := range r.queue {
		if lost(h.lastConn()) {
			h.renewAt = now
			if !h.busy {
				h.due = now
			}
		}
	}
	heap.Init(&r.queue)
}

// closed loses every holding: the client was closed.
func (r *renewer) closed() {
	r.mu.Lock()
	hs := r.queue
	r.queue = nil
	r.running = false
	for _, h := range hs {
		h.index = -1
	}
	r.mu.Unlock()
	for _, h := range hs {
		h.lose(fmt.Errorf("%w: %w", ErrClosed, sskv.ErrClosed))
	}
}

// work renews h (or only confirms its key), then schedules its next
// renewal.
func (r *renewer) work(h *holding, confirmOnly bool) {
	l := h.l
	var next time.Time
	ended := false
	if confirmOnly {
		ended = errors.Is(h.recheckNow(), errEnded)
	} else {
		sent, err := h.write(context.Background(), nil) // within ends it with the holding
		if f := l.cfg.OnRenewal; f != nil && !sent.IsZero() {
			rerr := err
			if errors.Is(err, errEnded) {
				rerr = h.err()
			}
			latency := time.Since(sent)
			l.callbacks().do(func() { f(latency, rerr) })
		}
		iv := l.cfg.RenewInterval
		switch {
		case err == nil:
			h.retry = nil
			// Up to a tenth of the interval late, at random, so that
			// renewals bunched together (by an outage, say) spread out
			// without a holding renewing more often than its interval
			// asks (the store's load is the number of renewals). The
			// jitter leaves most of the time to the renew deadline to
			// retries.
			next = sent.Add(iv + rand.N(renewJitter(iv, l.cfg.RenewDeadline)+1))
		case errors.Is(err, errEnded):
			ended = true
		case errors.Is(err, sskv.ErrNotSent), errors.Is(err, sskv.ErrConnectionLost):
			// The connection was lost: renew once the next one is up,
			// which confirm waits for.
			l.log.Debug("renewal failed with the connection; renewing on the next one", "error", err)
			next = time.Now()
		default:
			// The outcome is unknown; the next renewal, with the same value,
			// is harmless whether or not this one was applied.
			l.log.Debug("renewal failed; retrying", "error", err)
			if h.retry == nil {
				h.retry = NewBackoff(max(iv/20, time.Millisecond), max(iv/4, time.Millisecond))
			}
			next = time.Now().Add(h.retry.NextBackOff())
		}
	}
	conn := h.lastConn()
	r.mu.Lock()
	h.busy = false
	r.busy--
	if ended || !h.live() {
		if h.index >= 0 {
			heap.Remove(&r.queue, h.index)
		}
	} else if h.index >= 0 {
		if !confirmOnly {
			h.renewAt = next
		}
		h.due = h.renewAt
		if h.pokeReq || lost(conn) {
			h.due = time.Now()
		}
		if exp := h.expiry(); h.due.After(exp) {
			// A retry (or a renewal) after the deadline would come too
			// late: the deadline is checked on time.
			h.due = exp
		}
		heap.Fix(&r.queue, h.index)
		if r.conn == nil || lost(r.conn) {
			r.conn = conn
		}
	}
	r.mu.Unlock()
	r.kick()
}

// renewHeap orders holdings by due.
type renewHeap []*holding

func (q renewHeap) Len() int           { return len(q) }
func (q renewHeap) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q renewHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}
func (q *renewHeap) Push(x any) {
	h := x.(*holding)
	h.index = len(*q)
	*q = append(*q, h)
}
func (q *renewHeap) Pop() any {
	old := *q
	n := len(old)
	h := old[n-1]
	old[n-1] = nil
	h.index = -1
	*q = old[:n-1]
	return h
}

// readyHeap orders the holdings due by renew deadline.
type readyHeap []*holding

func (q readyHeap) Len() int           { return len(q) }
func (q readyHeap) Less(i, j int) bool { return q[i].readyBy.Before(q[j].readyBy) }
func (q readyHeap) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *readyHeap) Push(x any)        { *q = append(*q, x.(*holding)) }
func (q *readyHeap) Pop() any {
	old := *q
	n := len(old)
	h := old[n-1]
	old[n-1] = nil
	*q = old[:n-1]
	return h
}

// scheduling is a holding's place in its renewer, guarded by the renewer's
// mutex.
type scheduling struct {
	index       int       // in the heap; -1 when not in it
	due         time.Time // when the renewer attends to it next
	renewAt     time.Time // when its next renewal is due
	readyBy     time.Time // while busy: the renew deadline it waits for a worker by
	busy        bool      // a renewal (or confirmation) waits for a worker or is in flight
	confirmOnly bool      // while busy: only confirm the key
	pokeReq     bool      // confirm the key now
	retry       *backoff.ExponentialBackOff
}

// A renewal goes out up to a batch window early, to join the renewals due
// before it: a thirtieth of its RenewInterval, at most maxBatchWindow.
// Renewals are spread over the interval (see add), and a store that takes
// them one by one sleeps and wakes between them: 10,000 locks (TTL 10 s)
// cost the local store about 15-20% less CPU in batches of up to 100 ms
// than of up to 20 ms, for a renew p99 of about 38 ms rather than 22
// (BenchmarkManyLocks).
const (
	batchWindowDiv = 30
	maxBatchWindow = 100 * time.Millisecond
)

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// renewJitter is the most a renewal is sent after its interval: a tenth of
// the interval, but at most a quarter of what the renew deadline leaves
// after it, so that a failed renewal still has time to be retried.
func renewJitter(interval, deadline time.Duration) time.Duration {
	return max(0, min(interval/10, (deadline-interval)/4))
}
