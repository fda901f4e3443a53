package wait

import (
	"context"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// Waiter is a Lock's wait policy over its Lease: racing waiters
// (Config.Race), or the queue. Its methods but New need the Lease's turn.
type Waiter struct {
	l *lease.Lease
	// q is the Lock's view of the lock's queue while it waits, holds or
	// has just held the lock (see queue.go); nil otherwise.
	q *queue
}

// New returns the Waiter of l.
func New(l *lease.Lease) Waiter { return Waiter{l: l} }

// Wait acquires the lock, waiting as long as ctx allows while someone else
// holds it. With an error, unknown reports that an attempt may have taken
// the key, which the caller then gives back (Lease.AbandonThenEnd).
func (w *Waiter) Wait(ctx context.Context) (unknown bool, err error) {
	if w.l.Config().Race {
		return w.race(ctx)
	}
	return w.queued(ctx)
}

// Release is Lease.Release, with the queue's handover to its first waiter.
func (w *Waiter) Release(ctx context.Context, to string) error {
	if w.q == nil {
		return w.l.Release(ctx, to, nil)
	}
	return w.l.Release(ctx, to, w.q)
}

// Close leaves the queue, if the Lock is in one, and drops a reservation of
// the key for it that came too late.
func (w *Waiter) Close(ctx context.Context) {
	if w.q == nil {
		return
	}
	w.q.leave()
	w.q.close()
	w.q = nil
	if w.l.Config().FenceKey {
		w.l.DropReservation(ctx)
	}
}

// The queue's part in a release (lease.Queue).

func (q *queue) HandOnKept() { q.handOnKept() }
func (q *queue) Release()    { q.release() }

func (q *queue) SendTurn(token hlc.Timestamp) { q.sendTurn(token) }

func (q *queue) HandOver() (lease.Next, bool) {
	first, ok := q.handOver()
	return lease.Next{ID: first.id, Rec: first.rec, Watches: watches(first.told)}, ok
}

// Race is lock.Acquire with Config.Race: it races for the lock cfg (valid,
// with its defaults filled in; an empty HolderID gives each attempt a
// Lease with a HolderID of its own), keeping no Lease while it sleeps, and
// returns the Lease that took the key, its turn free.
func Race(ctx context.Context, c *sskv.Client, cfg lease.Config) (*lease.Lease, error) {
	r := racer{c: c, cfg: cfg, log: lease.Logger(&cfg)}
	unknown, err := r.wait(ctx)
	if err != nil {
		if unknown {
			r.l.AbandonThenEnd()
		} else if r.l != nil {
			r.l.End()
		}
		return nil, lease.Wrap(cfg.Name, "", err)
	}
	r.l.End()
	return r.l, nil
}
