package localstore

import (
	"encoding/binary"
	"hash/maphash"
	"time"
)

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
	// answerWindowMin is how long an answer is kept at least, whatever the
	// request's Message Expiry Interval: a client resends its copy with the
	// interval it first gave, and the store counts it from when it reads
	// the copy, so a session resumed after the interval would have the copy
	// executed. A busy client keeps no more for it: its answers also go
	// when it reuses their packet ids.
	answerWindowMin = time.Minute
	// answerWindowMax bounds how long an answer is kept, whatever the
	// request's Message Expiry Interval.
	answerWindowMax = 5 * time.Minute
	// maxAnswers bounds the answers kept (about 300 bytes each); beyond it,
	// new answers are not kept until a sweep makes room.
	maxAnswers = 1 << 18
	// sweepEvery is how many answers are kept between two sweeps of the
	// expired ones.
	sweepEvery = 4096
)

// answers keeps the answers to recent requests that changed the store.
// Guarded by Server.mu, as the store is (key and slot only read the seeds,
// and are called before it): a request is looked up and executed, and its
// answer kept, under one hold of the lock, so that a repeat never runs
// beside the original.
//
// A repeat is recognized by its client id, correlation data, payload and
// timestamp (__ts), hashed to 128 bits with seeds of the process's own: a
// copy is the same PUBLISH, and a client that reuses correlation data for
// another request (the protocol does not forbid it), or a new session of
// the same client id, sends another payload or timestamp. A mistaken
// match is as likely as guessing a random 128-bit number.
//
// An answer is kept under its request's packet id too: a client reuses a
// packet id only once it has the PUBACK of the PUBLISH that had it
// [MQTT-2.2.1-4], so that PUBLISH will not be resent, and its answer goes.
// So a client keeps at most one answer per packet id (65,535), however many
// requests it sends within the window.
type answers struct {
	seeds  [2]maphash.Seed
	bySlot map[answerSlot]keptAnswer
	byKey  map[answerKey]answerSlot
	kept   int // since the last sweep
	limit  int // maxAnswers unless set (tests)
}

func (a *answers) max() int {
	if a.limit > 0 {
		return a.limit
	}
	return maxAnswers
}

// answerKey is the hash of a request's client id, correlation data,
// payload and timestamp.
type answerKey [2]uint64

// answerSlot is a request's client (its id's hash) and packet id.
type answerSlot struct {
	client uint64
	id     uint16
}

type keptAnswer struct {
	key   answerKey
	res   result
	until int64 // UnixNano
}

// init makes the seeds, unless made. The store calls it before serving,
// so that key and slot, called outside its lock, only read them.
func (a *answers) init() {
	if a.seeds == [2]maphash.Seed{} {
		a.seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
	}
}

// key returns the key of clientID's request with correlation data corr,
// payload and timestamp ts ("" if none).
func (a *answers) key(clientID string, corr, payload []byte, ts string) answerKey {
	a.init()
	var k answerKey
	var h maphash.Hash
	var n [8]byte
	for i, seed := range a.seeds {
		h.SetSeed(seed)
		// Each part after its length, so that no two requests' parts run
		// together into the same bytes.
		for _, part := range [][]byte{[]byte(clientID), corr, payload, []byte(ts)} {
			binary.LittleEndian.PutUint64(n[:], uint64(len(part)))
			h.Write(n[:])
			h.Write(part)
		}
		k[i] = h.Sum64()
	}
	return k
}

// slot returns the slot of clientID's request with packet id id.
func (a *answers) slot(clientID string, id uint16) answerSlot {
	a.init()
	return answerSlot{client: maphash.String(a.seeds[0], clientID), id: id}
}

// lookup returns the answer kept for key, if any.
func (a *answers) lookup(key answerKey, now time.Time) (result, bool) {
	slot, ok := a.byKey[key]
	if !ok {
		return result{}, false
	}
	e := a.bySlot[slot]
	if e.key != key || e.until <= now.UnixNano() {
		return result{}, false
	}
	return e.res, true
}

// keep keeps res as the answer to the request key in slot until window
// has passed. It replaces the answer to the client's earlier request with
// the same packet id.
func (a *answers) keep(key answerKey, slot answerSlot, res result, window time.Duration, now time.Time) {
	if a.kept++; a.kept >= sweepEvery {
		a.sweep(now) // it drops the maps if it empties them
	}
	if a.bySlot == nil {
		a.bySlot, a.byKey = make(map[answerSlot]keptAnswer), make(map[answerKey]answerSlot)
	}
	if len(a.bySlot) >= a.max() {
		return // full until a sweep makes room: one sweep per sweepEvery requests, not per request
	}
	if old, ok := a.bySlot[slot]; ok && a.byKey[old.key] == slot {
		delete(a.byKey, old.key)
	}
	a.bySlot[slot] = keptAnswer{key: key, res: res, until: now.Add(window).UnixNano()}
	a.byKey[key] = slot
}

// sweep forgets the answers whose time has come.
func (a *answers) sweep(now time.Time) {
	a.kept = 0
	t := now.UnixNano()
	for slot, e := range a.bySlot {
		if e.until <= t {
			delete(a.bySlot, slot)
			if a.byKey[e.key] == slot {
				delete(a.byKey, e.key)
			}
		}
	}
	if len(a.bySlot) == 0 {
		a.bySlot, a.byKey = nil, nil // give back what a burst grew: maps never shrink
	}
}

// answerWindow returns how long the answer to a request with the given
// Message Expiry Interval (zero: none) is kept: as long as a copy of it
// may still be delivered.
func answerWindow(expiry time.Duration) time.Duration {
	return min(max(expiry, answerWindowMin), answerWindowMax)
}
