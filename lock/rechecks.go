package lock

import (
	"container/heap"
	"sync"
	"time"

	"github.com/dsslock/dsslock/sskv"
)

// rechecks is a client's schedule of its racing waiters' rechecks (see
// recheckAfter): one timer for all of them. An election has followers by
// the thousand, each asleep while its leader renews, and a timer each
// would cost each of them more than its place in this heap.
type rechecks struct {
	base time.Time // dues are durations since base, on the monotonic clock

	mu    sync.Mutex
	q     recheckQueue
	timer *time.Timer   // fires at armed; made at the first recheck
	armed time.Duration // 0 while timer is stopped
}

// rechecksKey is the key of a client's rechecks (sskv.Client.Shared).
type rechecksKey struct{}

// rechecksOf returns the rechecks of c.
func rechecksOf(c *sskv.Client) *rechecks {
	return c.Shared(rechecksKey{}, func() any {
		return &rechecks{base: time.Now()}
	}).(*rechecks)
}

// set has b's recheck timer fire after d, in place of any earlier setting.
// A recheck that fires as it is set again may wake the waiter once too
// often: the waiter then checks the lock early, which is harmless.
func (r *rechecks) set(b *waitBox, d time.Duration) {
	due := addSat(time.Since(r.base), max(d, 1)) // d saturates for a huge TTL (recheckAfter)
	r.mu.Lock()
	defer r.mu.Unlock()
	b.due = due
	if b.index < 0 {
		heap.Push(&r.q, b)
	} else {
		heap.Fix(&r.q, int(b.index))
	}
	r.arm()
}

// stop cancels b's recheck, if it is set.
func (r *rechecks) stop(b *waitBox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b.index >= 0 {
		heap.Remove(&r.q, int(b.index))
	}
	r.arm()
}

// arm sets the timer for the earliest recheck, or stops it if there is
// none. Called with r.mu held.
func (r *rechecks) arm() {
	if len(r.q) == 0 {
		if r.armed != 0 {
			r.timer.Stop()
			r.armed = 0
		}
		return
	}
	due := r.q[0].due
	if r.armed == due {
		return
	}
	d := due - time.Since(r.base)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.fire)
	} else {
		r.timer.Reset(d)
	}
	r.armed = due
}

// fire wakes the waiters whose rechecks are due.
func (r *rechecks) fire() {
	now := time.Since(r.base)
	var due []*waitBox
	r.mu.Lock()
	for len(r.q) > 0 && r.q[0].due <= now {
		due = append(due, heap.Pop(&r.q).(*waitBox))
	}
	r.armed = 0
	r.arm()
	r.mu.Unlock()
	for _, b := range due {
		b.fire(recheckTimer)
	}
}

// recheckQueue is a heap of waiters' boxes, the earliest recheck first.
type recheckQueue []*waitBox

func (q recheckQueue) Len() int           { return len(q) }
func (q recheckQueue) Less(i, j int) bool { return q[i].due < q[j].due }
func (q recheckQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = int32(i), int32(j)
}

func (q *recheckQueue) Push(x any) {
	b := x.(*waitBox)
	b.index = int32(len(*q))
	*q = append(*q, b)
}

func (q *recheckQueue) Pop() any {
	old := *q
	b := old[len(old)-1]
	old[len(old)-1] = nil
	b.index = -1
	*q = old[:len(old)-1]
	if cap(*q) > 64 && len(*q) < cap(*q)/4 {
		*q = append(recheckQueue(nil), *q...) // give back what a crowd of waiters left
	}
	return b
}
