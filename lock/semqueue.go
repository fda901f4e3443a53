package lock

import (
	"bytes"
	"slices"
	"strconv"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// What a Semaphore needs of its slot 0's Lock, whose queue is the
// semaphore's queue (see semwait.go).

// semHooks links a slot 0's Lock to its Semaphore.
type semHooks struct {
	waitSig chan struct{} // capacity 1: the wait's place may have changed
	keepSig chan struct{} // capacity 1: the queue kept may have changed
	// offer is called, on a goroutine of its own, when a holder of slot 0
	// reserved another slot for this participant.
	offer func(slot int, version hlc.Timestamp)
}

// signalWait tells the Semaphore that this Lock's place in its queue, or
// the queue it keeps, may have changed.
func (l *Lock) signalWait() {
	if l.sem == nil {
		return
	}
	for _, c := range []chan struct{}{l.sem.waitSig, l.sem.keepSig} {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// place is where a wait stands in its queue.
type place struct {
	waiting  bool // a wait is under way, without the lock
	turn     bool // the lock was released to it: it takes the key
	joined   bool // its join went to a holder (and it is not about to join again)
	acked    bool // the join was confirmed
	joinedAt time.Time
}

// queuePlace returns where this Lock's wait stands in its queue.
func (l *Lock) queuePlace() place {
	q := l.qv.Load()
	if q == nil {
		return place{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return place{
		waiting:  q.waiting && !q.holds && !q.ended,
		turn:     q.turn,
		joined:   q.joinedTo != "" && q.joinedTo != "?" && !q.rejoin,
		acked:    q.acked,
		joinedAt: q.joinedAt,
	}
}

// firstWaiter returns the first waiter of the queue this Lock keeps, while
// it holds the lock and is not releasing it.
func (l *Lock) firstWaiter() (entry, bool) {
	q := l.qv.Load()
	if q == nil {
		return entry{}, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.holds || q.releasing || q.ended || len(q.entries) == 0 {
		return entry{}, false
	}
	return q.entries[0], true
}

// served takes the waiter id out of the queue this Lock keeps, as served
// (a new watcher of the key is told if it was one), and reports whether it
// was in it: false if it left, or if the queue was handed on.
func (l *Lock) served(id string) bool {
	q := l.qv.Load()
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.holds || q.releasing || q.ended {
		return false
	}
	i := slices.IndexFunc(q.entries, func(e entry) bool { return e.id == id })
	if i < 0 {
		return false
	}
	q.remove(i)
	q.settle()
	return true
}

// offered handles an offer of a slot (msgSlot). q.mu is held.
func (l *Lock) offered(body []byte) {
	if l.sem == nil {
		return
	}
	if slot, version, ok := parseOffer(body); ok {
		go l.sem.offer(slot, version)
	}
}

// offerBody encodes an offer of slot, reserved with version.
func offerBody(slot int, version hlc.Timestamp) []byte {
	b := strconv.AppendInt([]byte{msgSlot}, int64(slot), 10)
	b = append(b, ',')
	b, _ = version.AppendText(b)
	return b
}

// parseOffer decodes an offer's body (after the kind byte).
func parseOffer(body []byte) (int, hlc.Timestamp, bool) {
	a, b, ok := bytes.Cut(body, []byte{','})
	if !ok {
		return 0, hlc.Timestamp{}, false
	}
	slot, err := strconv.Atoi(string(a))
	if err != nil || slot < 1 || slot >= maxSemaphoreLimit {
		return 0, hlc.Timestamp{}, false
	}
	v, err := hlc.ParseBytes(b)
	if err != nil || v.IsZero() {
		return 0, hlc.Timestamp{}, false
	}
	return slot, v, true
}
