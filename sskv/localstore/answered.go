package localstore

import "time"

// A request that a client's resumed session sends again (the same PUBLISH,
// with its correlation data, because the client never saw its PUBACK) must
// not be executed twice: a DEL or an unconditional SET repeated after
// another client's write would undo that write. The Azure IoT Operations
// request/response protocol has the executor answer such a repeat from a
// cache, keyed by correlation data, until the request expires; the store
// does the same for the requests that change it (SET, DEL, VDEL).
//
// GET is executed again (it changes nothing), and so is KEYNOTIFY: a watch
// belongs to a connection, and a repeat on the new connection must register
// the watch there.

const (
	// answerWindowDefault is how long the answer to a request without a
	// Message Expiry Interval is kept.
	answerWindowDefault = time.Minute
	// answerWindowMax bounds how long an answer is kept, whatever the
	// request's Message Expiry Interval.
	answerWindowMax = 5 * time.Minute
	// maxAnswers bounds the answers kept: beyond it, the oldest go first.
	maxAnswers = 1 << 20
)

// answers keeps the answers to recent requests that changed the store, by
// client id and correlation data. Guarded by Server.mu, as the store is: a
// request is looked up and executed, and its answer kept, under one hold of
// the lock, so that a repeat never runs beside the original.
type answers struct {
	byKey map[string]result
	// order lists the kept answers in the order they were kept, with the
	// time each may go; the list from head on is live.
	order []answerAge
	head  int
}

type answerAge struct {
	key   string
	until int64 // UnixNano
}

// answerKey is the key of a client's request with correlation data corr.
// Client ids never contain a NUL (MQTT strings may not).
func answerKey(clientID string, corr []byte) string {
	return clientID + "\x00" + string(corr)
}

// lookup returns the answer kept for key, if any.
func (a *answers) lookup(key string) (result, bool) {
	r, ok := a.byKey[key]
	return r, ok
}

// keep keeps res as the answer to key until window has passed.
func (a *answers) keep(key string, res result, window time.Duration, now time.Time) {
	a.expire(now)
	if a.byKey == nil {
		a.byKey = make(map[string]result)
	}
	if _, ok := a.byKey[key]; ok {
		return // the first answer stands
	}
	if len(a.byKey) >= maxAnswers {
		a.drop()
	}
	a.byKey[key] = res
	a.order = append(a.order, answerAge{key: key, until: now.Add(window).UnixNano()})
}

// expire forgets the answers whose time has come, oldest first: an answer
// kept longer behind one with a shorter window waits for it, which only
// keeps that one longer.
func (a *answers) expire(now time.Time) {
	t := now.UnixNano()
	for a.head < len(a.order) && a.order[a.head].until <= t {
		a.drop()
	}
}

// drop forgets the oldest answer kept.
func (a *answers) drop() {
	delete(a.byKey, a.order[a.head].key)
	a.order[a.head] = answerAge{}
	a.head++
	switch {
	case a.head == len(a.order):
		a.order, a.head = a.order[:0], 0
		if cap(a.order) > 4096 {
			// Give back what a burst grew: the map never shrinks.
			a.order, a.byKey = nil, nil
		}
	case a.head > len(a.order)/2 && a.head >= 1024:
		n := copy(a.order, a.order[a.head:])
		clear(a.order[n:])
		a.order, a.head = a.order[:n], 0
	}
}

// answerWindow returns how long the answer to a request with the given
// Message Expiry Interval (zero: none) is kept: as long as a copy of it
// may still be delivered.
func answerWindow(expiry time.Duration) time.Duration {
	if expiry <= 0 {
		return answerWindowDefault
	}
	return min(expiry, answerWindowMax)
}
