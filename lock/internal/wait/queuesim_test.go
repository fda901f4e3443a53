package wait

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// A deterministic simulation of the wait queue (docs/design/queue.md),
// in the manner of FoundationDB's and TigerBeetle's simulators: the real
// qcore (queuestep.go) of each participant, a model of the store
// (simstore_test.go), a simulated clock, and a seeded scheduler that picks
// every delay and fault. A run is a function of its seed alone, so a
// failing seed replays exactly. queuesim_run_test.go runs the seeds.
//
// What is modelled of a Lock besides qcore: the thin loop of
// Waiter.queued (one action at a time, a retry after a failed request,
// the grace and recheck lease.Timers, the hold-off after a reconnect and the
// reservation read that lifts it), the acquisition (SET NEX PX, and with
// FenceKey the fenced second SET), the holding (renewals, the renew
// deadline on its own clock, the confirmation after a reconnect), and the
// release (queue.md 4.4). Faults: delays, any interleaving between
// connections (each connection keeps its order), pauses and crashes of any
// participant, lost connections (the store's notifications coalesced into
// a Resync, answers lost), and store restarts.

// simCfg is one run's shape, drawn from its seed.
type simCfg struct {
	nodes    int
	cycles   int // Lock calls per participant
	fenceKey bool
	faults   bool // crashes, pauses, reconnects, restarts
	slow     bool // some deliveries take up to a TTL/4
	lagging  bool // answers lag behind notifications by up to 3 ms
}

const (
	simTTL      = time.Second
	simInterval = 300 * time.Millisecond // RenewInterval
	simDeadline = 700 * time.Millisecond // RenewDeadline
	simName     = "lk"
)

// simEpoch is the simulated time's origin, for qcore's time.Time.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type simEvent struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type simHeap []simEvent

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *simHeap) Push(x any)   { *h = append(*h, x.(simEvent)) }
func (h *simHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// simPhase is where a participant is in its cycle.
type simPhase uint8

const (
	phIdle    simPhase = iota // between cycles
	phWaiting                 // in Lock
	phHolding                 // holds (or held until lost) and has not released yet
	phDone                    // all cycles done
	phCrashed
)

type simPart struct {
	idx   int
	inc   int // incarnation: a crash and restart makes a new Lock
	id    string
	conn  int // the store connection of this incarnation
	epoch int // counts this connection's losses: answers to older requests are lost
	c     *qcore
	phase simPhase
	nonce string

	pausedUntil time.Duration
	parked      []func() // deliveries while paused, in order

	// The waiter's loop.
	busy         bool // a request of the loop is in flight
	retryAt      time.Duration
	recheckGen   uint64
	attempting   bool
	turnQueue    []qsend // gives that wait for the Lock's turn
	leaving      int     // leaves and turns being written
	holdOff      time.Duration
	keyReg       bool // a KEYNOTIFY of the key is registered in the store
	keyBuf       []simNote
	keyGen       int // counts registrations: notes of older ones are dropped
	waitStart    time.Duration
	upAt, downAt time.Duration // the last arrival on its connection, each way: TCP keeps their order
	scheduled    int           // deliveries of notifications under way
	joinAt       time.Duration // when its first join of this wait reached the Lock it went to; -1: none yet
	overtaken    int
	lostPlace    bool // a fault may have cost it its place in this wait

	// The holding.
	token    hlc.Timestamp
	rec      []byte // the key's record while it holds
	lastOK   time.Duration
	lost     bool
	confirm  bool // renewals confirm the key first (after a reconnect)
	holdGen  int
	cycle    int
	acquired int
}

// sim is one run.
type sim struct {
	seed      uint64
	cfg       simCfg
	rng       *rand.Rand
	now       time.Duration
	events    simHeap
	seq       uint64
	st        *simStore
	nodes     []*simPart
	nconn     int
	expiry    map[time.Duration]bool // expiries with an event queued
	faults    int                    // faults injected so far
	flappers  []*simPart             // the only fault is these participants' flapping connection
	restarted time.Duration          // the last store restart
	lastFault time.Duration
	err       error
	trace     []string
	// The oracle's records.
	lastToken hlc.Timestamp
	maxOver   int
	rechecks  int
	handovers int
	sends     int
	steps     int
	keepTrace bool
}

func (s *sim) t() time.Time { return simEpoch.Add(s.now) }

func (s *sim) at(d time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, simEvent{at: s.now + d, seq: s.seq, fn: fn})
}

func (s *sim) logf(format string, args ...any) {
	if s.keepTrace {
		s.trace = append(s.trace, fmt.Sprintf("%9.3fms ", float64(s.now)/1e6)+fmt.Sprintf(format, args...))
	}
}

func (s *sim) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("seed %d at %v: %s", s.seed, s.now, fmt.Sprintf(format, args...))
	}
}

// delay is a network delay: mostly under a millisecond, sometimes more.
func (s *sim) delay() time.Duration {
	switch r := s.rng.IntN(100); {
	case r < 70:
		return time.Duration(s.rng.IntN(500)) * time.Microsecond
	case r < 95 || !s.cfg.slow:
		return time.Duration(1+s.rng.IntN(5)) * time.Millisecond
	default:
		return time.Duration(s.rng.IntN(int(simTTL / 4)))
	}
}

// newSim draws a run from seed.
func newSim(seed uint64) *sim {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &sim{seed: seed, rng: rng, st: newSimStore(), expiry: map[time.Duration]bool{}}
	s.cfg = simCfg{
		nodes:    2 + rng.IntN(4),
		cycles:   2 + rng.IntN(3),
		fenceKey: rng.IntN(2) == 0,
		faults:   rng.IntN(3) > 0,
		slow:     rng.IntN(4) == 0,
		lagging:  rng.IntN(3) == 0,
	}
	for i := range s.cfg.nodes {
		n := &simPart{idx: i}
		s.nodes = append(s.nodes, n)
		s.boot(n)
	}
	return s
}

// boot starts n's next incarnation: a new Lock, connection and queue.
func (s *sim) boot(n *simPart) {
	n.inc++
	n.id = fmt.Sprintf("n%d.%d", n.idx, n.inc)
	n.nonce = fmt.Sprintf("%04x", s.rng.Uint32()&0xffff)
	s.nconn++
	n.conn, n.epoch, n.scheduled = s.nconn, 0, 0
	n.c = &qcore{self: n.id, ttl: simTTL, fenceKey: s.cfg.fenceKey, keepWatch: !s.cfg.fenceKey}
	n.c.rec = s.acqRecord(n)
	n.phase, n.busy, n.attempting, n.keyReg, n.keyBuf, n.turnQueue = phIdle, false, false, false, nil, nil
	n.lost, n.confirm, n.rec, n.leaving = false, false, nil, 0
	n.holdOff = 0
	if s.restarted > 0 && s.now < s.restarted+simTTL {
		// It started while the store was down, or just after: its first
		// connection holds off as after an outage. (One whose first
		// connection succeeds at once right after a restart cannot know:
		// the documented limit of lock.md, "Store restarts".)
		n.holdOff = s.restarted + simTTL
	}
	// The queue's watches: its inbox and the roll call (their first
	// events are ignored, as queue.run does).
	s.st.watch(n.conn, simName+InboxInfix+n.id)
	s.st.watch(n.conn, simName+queueSuffix)
	s.think(n)
}

// acqRecord is n's acquisition record (Lock.acqRecord).
func (s *sim) acqRecord(n *simPart) []byte {
	if !s.cfg.fenceKey {
		return []byte(n.id)
	}
	return []byte(n.id + "\n~" + n.nonce + "\n")
}

func (s *sim) record(n *simPart, token hlc.Timestamp) []byte {
	if !s.cfg.fenceKey {
		return []byte(n.id)
	}
	b := []byte(n.id + "\n")
	b, _ = token.AppendText(b)
	return append(b, '\n')
}

// live reports whether n (incarnation inc) can act now; if it is paused,
// fn is parked until it resumes.
func (s *sim) live(n *simPart, inc int, fn func()) bool {
	if n.inc != inc || n.phase == phCrashed {
		return false
	}
	if s.now < n.pausedUntil {
		n.parked = append(n.parked, fn)
		return false
	}
	return true
}

// on schedules fn for n after d, unless n has crashed (or restarted) by
// then; paused, it runs when n resumes.
func (s *sim) on(n *simPart, d time.Duration, fn func()) {
	inc := n.inc
	var run func()
	run = func() {
		if s.live(n, inc, run) {
			fn()
		}
	}
	s.at(d, run)
}

// request sends op over n's connection: it is applied at the store after a
// delay (in the connection's order), and its answer reaches n after
// another, unless the connection is lost meanwhile (then answer gets err).
func (s *sim) request(n *simPart, op func() error, answer func(err error)) {
	inc, epoch := n.inc, n.epoch
	n.upAt = max(n.upAt, s.now+s.delay())
	s.at(n.upAt-s.now, func() {
		if n.inc != inc {
			return // crashed: the store has closed its connection
		}
		if n.epoch != epoch {
			// Lost with the connection: applied or not, as it happens;
			// the answer is lost.
			if s.rng.IntN(2) == 0 {
				_ = op()
				s.flush()
			}
			s.on(n, s.delay(), func() { answer(errSimLost) })
			return
		}
		err := op()
		s.flush()
		d := s.delay()
		if s.cfg.lagging {
			d += time.Duration(s.rng.IntN(int(3 * time.Millisecond)))
		}
		s.on(n, d, func() {
			if n.epoch != epoch {
				answer(errSimLost)
				return
			}
			answer(err)
		})
	})
}

var errSimLost = errors.New("sim: connection lost")

// flush delivers the store's new notifications, each connection's in
// order, after delays.
//
// A notification leaves the store's queue only when it reaches the
// participant, so that one still on its way when the connection is lost
// counts as missed, and the store's Resync reports it.
func (s *sim) flush() {
	for _, n := range s.nodes {
		if n.phase == phCrashed {
			for s.st.pending(n.conn) > 0 {
				s.st.pop(n.conn)
			}
			continue
		}
		for s.st.pending(n.conn) > n.scheduled {
			n.scheduled++
			epoch, conn := n.epoch, n.conn
			n.downAt = max(n.downAt, s.now+s.delay())
			s.on(n, n.downAt-s.now, func() {
				if n.epoch != epoch || n.conn != conn {
					return
				}
				n.scheduled--
				if note, ok := s.st.pop(conn); ok {
					s.deliver(n, note, n.keyGen)
				}
			})
		}
	}
}

// deliver hands a notification to n's queue.
func (s *sim) deliver(n *simPart, note simNote, gen int) {
	switch {
	case note.Key == simName:
		if gen != n.keyGen {
			return // of a watch since stopped
		}
		if n.attempting && s.cfg.fenceKey || !n.c.key.watching {
			// The guard has the watch during a FenceKey attempt, and a
			// watch's events wait for its start (queue.watchKey).
			n.keyBuf = append(n.keyBuf, note)
			return
		}
		s.step(n, qevent{kind: evKey, key: sskv.Event{Key: note.Key, Op: note.Op, Value: note.Value, Version: note.Version, Resync: note.Resync}})
	case note.Key == simName+queueSuffix:
		if note.Op == sskv.OpSet {
			s.step(n, qevent{kind: evRoll, value: note.Value})
		}
	case strings.HasPrefix(note.Key, simName+InboxInfix):
		if note.Op == sskv.OpSet || note.Resync {
			var v []byte
			if note.Op == sskv.OpSet {
				v = note.Value
				s.joining(v)
			}
			s.step(n, qevent{kind: evInbox, value: v, version: note.Version, resync: note.Resync})
		}
	}
}

// step applies ev to n's qcore, writes what it asks, and runs n's loop.
func (s *sim) step(n *simPart, ev qevent) {
	s.steps++
	out := n.c.step(s.t(), ev)
	if s.keepTrace {
		s.logf("%s %s -> %s/%s entries=%d", n.id, ev.describe(), n.c.keeper, n.c.w.role, len(n.c.entries))
		for _, q := range out {
			s.logf("    send to=%s roll=%v give=%v %q", q.to, q.roll, q.give, q.msg)
		}
	}
	s.write(n, out)
	s.check(n)
	s.drive(n)
}

// write makes n's writes (queue.write).
func (s *sim) write(n *simPart, out []qsend) {
	s.sends += len(out)
	if s.sends > 1000+40*s.handovers {
		s.fail("%d messages for %d handovers: messages go round", s.sends, s.handovers)
	}
	for _, q := range out {
		ordered := len(q.msg) > 0 && (q.msg[0] == msgLeave || q.msg[0] == msgTurn) && !(q.turn && !q.give.IsZero())
		if ordered {
			n.leaving++ // the loop's next join waits for it (queue.leaveWritten)
		}
		// Each write is a goroutine (queue.write): it goes out after a
		// scheduling delay. A give with the Lock's turn waits while a Lock
		// call (which has the turn) is under way.
		s.on(n, time.Duration(s.rng.IntN(int(time.Millisecond))), func() {
			if q.turn && !q.give.IsZero() && n.phase == phWaiting {
				n.turnQueue = append(n.turnQueue, q)
				return
			}
			s.send(n, q, ordered)
		})
	}
}

// endCall ends n's Lock call: the writes that waited for its turn go.
func (s *sim) endCall(n *simPart) {
	q := n.turnQueue
	n.turnQueue = nil
	for _, g := range q {
		s.send(n, g, false)
	}
}

func (s *sim) send(n *simPart, q qsend, ordered bool) {
	first := s.now
	var msg func()
	msg = func() {
		if q.msg == nil {
			return
		}
		key := simName + InboxInfix + q.to
		if q.roll {
			key = simName + queueSuffix
		}
		s.request(n, func() error {
			_, _, err := s.st.set(key, q.msg, simSet{TTL: 10 * simTTL})
			return err
		}, func(err error) {
			if errors.Is(err, errSimLost) && s.now-first < simTTL {
				// Written again once the connection is back (queue.write).
				s.on(n, simTTL/100+time.Duration(s.rng.IntN(int(simTTL/20))), msg)
				return
			}
			if ordered {
				n.leaving--
				s.drive(n)
			}
		})
	}
	if q.give.IsZero() {
		msg()
		return
	}
	rec := s.acqRecord(n)
	s.request(n, func() error {
		_, err := s.st.vdel(simName, rec, q.give)
		return err
	}, func(error) { msg() })
}

// check applies the queue's own invariants to n's state (queue.md 3.2).
func (s *sim) check(n *simPart) {
	c := n.c
	if c.holds() && c.waiting() {
		s.fail("%s holds and waits (%s)", n.id, c.w.role)
	}
	if c.w.role == waitSecond && len(c.w.ahead) == 0 {
		s.fail("%s is second with nobody ahead", n.id)
	}
	if n.phase == phHolding && c.waiting() {
		s.fail("%s holds the key but its queue waits", n.id)
	}
}

// think schedules n's next Lock call.
func (s *sim) think(n *simPart) {
	d := time.Duration(s.rng.IntN(int(30 * time.Millisecond)))
	s.on(n, d, func() {
		if n.phase != phIdle {
			return
		}
		if n.cycle >= s.cfg.cycles {
			n.phase = phDone
			return
		}
		n.cycle++
		n.phase, n.waitStart, n.overtaken, n.lostPlace, n.joinAt = phWaiting, s.now, 0, false, -1
		n.c.rec = s.acqRecord(n)
		// A Lock whose holding ended without handing over hands the queue
		// on first (waitQueued).
		s.step(n, qevent{kind: evKeptLost})
		n.recheckGen++
		s.recheck(n)
		s.step(n, qevent{kind: evStart})
		if s.rng.IntN(8) == 0 {
			// This Lock call gives up (its context ends).
			s.giveUp(n, n.cycle, time.Duration(s.rng.IntN(int(2*simTTL))))
		}
	})
}

// giveUp ends n's wait for cycle after d, as a Lock call whose context
// ended between two requests (evLeave, and the key's watch stopped).
func (s *sim) giveUp(n *simPart, cycle int, d time.Duration) {
	s.on(n, d, func() {
		switch {
		case n.phase != phWaiting || n.cycle != cycle:
		case n.busy:
			s.giveUp(n, cycle, time.Millisecond)
		default:
			s.logf("%s gives up", n.id)
			n.recheckGen++
			s.step(n, qevent{kind: evLeave})
			if n.keyReg {
				s.st.unwatch(n.conn, simName)
				n.keyReg = false
			}
			n.keyGen++
			n.keyBuf = nil
			n.c.step(s.t(), qevent{kind: evUnwatched})
			n.phase = phIdle
			s.endCall(n)
			s.think(n)
		}
	})
}

// recheck arms the safeguard recheck.
func (s *sim) recheck(n *simPart) {
	n.recheckGen++
	gen := n.recheckGen
	d := recheckTTLs*simTTL + simTTL/2 + time.Duration(s.rng.IntN(int(simTTL/2)))
	s.on(n, d, func() {
		if gen != n.recheckGen || n.phase != phWaiting {
			return
		}
		s.rechecks++
		// Slow deliveries (beyond queueGrace) break the timing the
		// optimistic rejoin counts on: they may cost the recheck too.
		if !s.cfg.slow && (s.faults == 0 || n.waitStart > s.lastFault+recheckTTLs*simTTL+simTTL) {
			s.fail("%s waited for the safeguard recheck with no fault (%s)", n.id, n.c.w.role)
		}
		s.recheck(n)
		s.step(n, qevent{kind: evRecheck})
	})
}

// retry makes n's loop wait for a backoff after a failed request.
func (s *sim) retry(n *simPart, d time.Duration) {
	if d <= 0 {
		d = simTTL/100 + time.Duration(s.rng.IntN(int(simTTL/4)))
	}
	n.retryAt = s.now + d
	s.on(n, d, func() { s.drive(n) })
}

// drive runs n's waiter loop (Waiter.queued) until it sleeps or waits
// for an answer.
func (s *sim) drive(n *simPart) {
	for n.phase == phWaiting && !n.busy && n.leaving == 0 && s.now >= n.retryAt && s.err == nil {
		a := n.c.next(s.t())
		s.logf("%s next: %+v", n.id, a)
		switch a.kind {
		case actSleep, actEnded:
			return
		case actWatch:
			n.busy = true
			s.request(n, func() error {
				s.st.watch(n.conn, simName) // its first event is ignored
				n.keyReg = true
				n.keyGen++
				return nil
			}, func(err error) {
				n.busy = false
				if err != nil {
					s.retry(n, 0)
					return
				}
				s.step(n, qevent{kind: evWatched})
				s.flushKeyBuf(n)
				s.drive(n)
			})
			return
		case actUnwatch:
			s.unwatch(n)
		case actGrace:
			gen := a.gen
			s.on(n, a.d, func() { s.step(n, qevent{kind: evGrace, gen: gen}) })
			return
		case actAttempt:
			s.attempt(n, a)
			return
		case actRejoin:
			s.join(n, msgRejoin, a.to)
			return
		case actGet:
			n.busy = true
			var val []byte
			var ver hlc.Timestamp
			var found bool
			s.request(n, func() error {
				val, ver, found = s.st.get(simName)
				return nil
			}, func(err error) {
				n.busy = false
				if err != nil {
					s.retry(n, 0)
					return
				}
				switch b := n.c.got(s.t(), found, val, ver); b.kind {
				case actAttempt:
					s.attempt(n, b)
				case actJoin:
					s.join(n, msgJoin, b.to) // the loop's next request
				default:
					s.drive(n)
				}
			})
			return
		}
	}
}

// join is the loop's SET of a msgJoin or msgRejoin (kind) into to's inbox.
func (s *sim) join(n *simPart, kind byte, to string) {
	msg := append([]byte{kind}, s.acqRecord(n)...)
	n.busy = true
	s.request(n, func() error {
		_, _, err := s.st.set(simName+InboxInfix+to, msg, simSet{TTL: 10 * simTTL})
		return err
	}, func(err error) {
		n.busy = false
		if err != nil {
			n.c.joinFailed()
			s.retry(n, 0)
			return
		}
		s.drive(n)
	})
}

func (s *sim) unwatch(n *simPart) {
	if n.keyReg {
		s.st.unwatch(n.conn, simName)
		n.keyReg = false
	}
	n.keyGen++
	n.keyBuf = nil
	s.step(n, qevent{kind: evUnwatched})
}

func (s *sim) flushKeyBuf(n *simPart) {
	buf := n.keyBuf
	n.keyBuf = nil
	for _, note := range buf {
		if !n.c.key.watching {
			return
		}
		s.step(n, qevent{kind: evKey, key: sskv.Event{Key: note.Key, Op: note.Op, Value: note.Value, Version: note.Version, Resync: note.Resync}})
	}
}

// attempt is the loop's try: hold-off, then the acquisition.
func (s *sim) attempt(n *simPart, a qaction) {
	until := max(n.holdOff, n.c.holdUntil.Sub(simEpoch))
	if s.now < until {
		if !a.ft.IsZero() && s.now >= n.c.holdUntil.Sub(simEpoch) {
			// reservedOn: a read on this connection lifts the hold-off if
			// it finds the reservation.
			n.busy = true
			var val []byte
			var ver hlc.Timestamp
			var found bool
			rec := s.acqRecord(n)
			s.request(n, func() error { val, ver, found = s.st.get(simName); return nil }, func(err error) {
				n.busy = false
				if err == nil && found && bytes.Equal(val, rec) {
					a.ft = ver
					s.take(n, a)
					return
				}
				if s.heldOff(n) {
					s.drive(n)
					return
				}
				n.c.attempted(a, true)
				s.retry(n, until-s.now)
			})
			return
		}
		if s.heldOff(n) {
			s.drive(n)
			return
		}
		n.c.attempted(a, true)
		s.retry(n, until-s.now)
		return
	}
	s.take(n, a)
}

// heldOff is queue.heldOff: the writes go out at once, with the turn.
func (s *sim) heldOff(n *simPart) bool {
	turned := n.c.w.role == waitTurned
	out := n.c.step(s.t(), qevent{kind: evHeldOff})
	s.logf("%s held off: %d sends", n.id, len(out))
	s.sends += len(out)
	handed := turned && n.c.w.role == waitStart
	for _, q := range out {
		s.send(n, q, false)
	}
	return handed
}

// take is attemptFenced: SET NEX PX fenced with a.ft, then with FenceKey
// the fenced SET of the record with the token.
func (s *sim) take(n *simPart, a qaction) {
	n.busy, n.attempting = true, true
	rec := s.acqRecord(n)
	sent := s.now
	var applied bool
	var ver hlc.Timestamp
	done := func(ok bool, failed bool, token hlc.Timestamp) {
		n.busy, n.attempting = false, false
		if ok && s.now-sent >= simDeadline {
			ok, failed = false, true // answered after the renew deadline
		}
		s.recheck(n)
		if ok {
			s.acquire(n, a, token, sent)
		} else {
			if failed {
				s.undo(n, rec, token)
			}
			if s.rng.IntN(2) == 0 {
				n.c.attempted(a, failed)
				s.flushKeyBuf(n)
			} else {
				s.flushKeyBuf(n)
				n.c.attempted(a, failed)
			}
		}
		if !ok {
			if failed {
				s.retry(n, 0)
			} else {
				s.drive(n)
			}
		}
	}
	s.request(n, func() error {
		var err error
		applied, ver, err = s.st.set(simName, rec, simSet{Cond: sskv.IfEqualOrNotExists, TTL: simTTL, FT: a.ft})
		return err
	}, func(err error) {
		switch {
		case errors.Is(err, sskv.ErrFencingTokenRequired):
			done(false, false, hlc.Timestamp{})
		case err != nil:
			done(false, true, hlc.Timestamp{})
		case !applied:
			done(false, false, hlc.Timestamp{})
		case !s.cfg.fenceKey:
			done(true, false, ver)
		case s.now-sent >= simDeadline:
			// Past the renew deadline, the second SET is not sent (its
			// context has ended): the attempt failed, and is undone.
			done(false, true, ver)
		default:
			token := ver
			frec := s.record(n, token)
			s.request(n, func() error {
				_, _, err := s.st.set(simName, frec, simSet{TTL: simTTL, FT: token})
				return err
			}, func(err error) {
				done(err == nil, err != nil, token)
			})
		}
	})
}

// undo deletes what a failed acquisition may have written
// (abandonThenEnd).
func (s *sim) undo(n *simPart, rec []byte, token hlc.Timestamp) {
	if !token.IsZero() {
		frec := s.record(n, token)
		s.request(n, func() error { _, err := s.st.vdel(simName, frec, token); return err }, func(error) {})
	}
	s.request(n, func() error { _, err := s.st.vdel(simName, rec, hlc.Timestamp{}); return err }, func(error) {})
}

// joining records that a join reaches the Lock it went to now: from then
// on its sender is in a queue, and fairness counts its overtakes.
func (s *sim) joining(msg []byte) {
	if len(msg) == 0 || msg[0] != msgJoin && msg[0] != msgRejoin {
		return
	}
	id := lease.ParseHolder(msg[1:], hlc.Timestamp{}).ID
	for _, n := range s.nodes {
		if n.id == id && n.joinAt < 0 && n.phase == phWaiting {
			n.joinAt = s.now
		}
	}
}

// acquire records n's acquisition, checks safety and fairness, and starts
// its holding.
func (s *sim) acquire(n *simPart, a qaction, token hlc.Timestamp, sent time.Duration) {
	for _, o := range s.nodes {
		if o != n && o.phase == phHolding && !o.lost && o.lastOK+simDeadline > s.now {
			s.fail("two holders: %s acquired while %s holds (until %v)", n.id, o.id, o.lastOK+simDeadline)
		}
	}
	if s.cfg.fenceKey {
		if !token.After(s.lastToken) {
			s.fail("token %v of %s not after %v", token, n.id, s.lastToken)
		}
		s.lastToken = token
	}
	// Fairness: every participant that joined the queue before n (or n
	// took the key without joining) and still waits is overtaken.
	at := n.joinAt
	if at < 0 {
		at = s.now
	}
	for _, o := range s.nodes {
		if o != n && o.phase == phWaiting && o.joinAt >= 0 && o.joinAt < at {
			o.overtaken++
			// The bound assumes that messages arrive within queueGrace: a
			// join not confirmed by then counts as sent to a holder that
			// keeps no queue (queue.md D10). Slow deliveries and faults
			// cost order, never safety or liveness.
			if !o.lostPlace && s.faults == 0 && !s.cfg.slow && o.overtaken > 2*(s.cfg.nodes-1) {
				s.fail("%s overtaken %d times with %d others", o.id, o.overtaken, s.cfg.nodes-1)
			}
			s.maxOver = max(s.maxOver, o.overtaken)
		}
	}
	if len(s.flappers) > 0 && !slices.Contains(s.flappers, n) && !s.cfg.slow && s.now-n.waitStart > 10*simTTL {
		// Others' flapping connection delays nobody else much.
		s.fail("%s waited %v while others' connection flapped", n.id, s.now-n.waitStart)
	}
	s.handovers++
	n.phase, n.token, n.lastOK, n.lost, n.confirm = phHolding, token, sent, false, false
	s.endCall(n)
	n.rec = s.record(n, token)
	n.acquired++
	n.holdGen++
	s.logf("%s acquired token %v (partial %v)", n.id, token, a.partial)
	s.step(n, qevent{kind: evAcquired, partial: a.partial, token: token})
	if s.cfg.fenceKey {
		s.unwatch(n) // the holding's guard took it over
	}
	if a.partial {
		s.on(n, min(max(simTTL/5, 50*time.Millisecond), simTTL), func() { s.step(n, qevent{kind: evRollDue}) })
	}
	gen := n.holdGen
	s.renewLater(n, gen)
	hold := time.Duration(s.rng.IntN(int(20 * time.Millisecond)))
	if s.rng.IntN(10) == 0 {
		hold = time.Duration(s.rng.IntN(int(2 * simTTL)))
	}
	s.on(n, hold, func() {
		if n.holdGen == gen && n.phase == phHolding {
			s.release(n)
		}
	})
}

// renewLater schedules n's next renewal, and its renew deadline.
func (s *sim) renewLater(n *simPart, gen int) {
	s.on(n, simInterval, func() {
		if n.holdGen != gen || n.phase != phHolding || n.lost {
			return
		}
		if s.now >= n.lastOK+simDeadline {
			n.lost = true
			return
		}
		sent := s.now
		rec, token := n.rec, n.token
		confirm := n.confirm
		var ok bool
		s.request(n, func() error {
			if confirm {
				v, _, found := s.st.get(simName)
				if !found || !bytes.Equal(v, rec) {
					return nil
				}
			}
			ft := hlc.Timestamp{}
			if s.cfg.fenceKey {
				ft = token
			}
			var err error
			ok, _, err = s.st.set(simName, rec, simSet{Cond: sskv.IfEqualOrNotExists, TTL: simTTL, FT: ft})
			return err
		}, func(err error) {
			if n.holdGen != gen || n.phase != phHolding || n.lost {
				return
			}
			switch {
			case err == nil && ok && s.now < sent+simDeadline:
				n.lastOK, n.confirm = sent, false
			case err == nil:
				n.lost = true // the key is not its own any more
			}
		})
		s.renewLater(n, gen)
	})
}

// release is Lock.release (queue.md 4.4).
func (s *sim) release(n *simPart) {
	held := !n.lost && s.now < n.lastOK+simDeadline
	n.phase = phIdle
	n.holdGen++
	if !held && s.rng.IntN(2) == 0 {
		// The holding was lost, and its user calls Lock again without
		// Unlock: the next wait hands on the queue it kept (evKeptLost).
		s.think(n)
		return
	}
	partial, kept := n.c.keeper == keepPartial, len(n.c.entries)
	out := n.c.step(s.t(), qevent{kind: evRelease})
	if partial && !slices.ContainsFunc(out, func(q qsend) bool { return q.roll }) {
		// L8: a holder without the whole queue calls the roll at its
		// release, if not before.
		s.fail("%s released as a partial holder without calling the roll", n.id)
	}
	s.write(n, out)
	first, handover := n.c.handTo, n.c.keeper == keepReleasing
	rec, token := n.rec, n.token
	s.logf("%s releases (held %v, handover %v to %s)", n.id, held, handover, first.id)
	turn := func(tok hlc.Timestamp) {
		out := n.c.step(s.t(), qevent{kind: evTurnOut, token: tok})
		if kept > 0 && !slices.ContainsFunc(out, func(q qsend) bool { return len(q.msg) > 0 && q.msg[0] == msgTurn }) {
			// L1: every release of a Lock that keeps entries sends one turn.
			s.fail("%s kept %d entries and sent no turn at its release", n.id, kept)
		}
		s.write(n, out)
		s.check(n)
		s.drive(n)
	}
	switch {
	case handover && held && s.cfg.fenceKey:
		var ver hlc.Timestamp
		s.request(n, func() error {
			var err error
			_, ver, err = s.st.set(simName, first.rec, simSet{TTL: simTTL, FT: token})
			return err
		}, func(err error) {
			if err != nil {
				ver = hlc.Timestamp{}
			}
			turn(ver)
			s.think(n) // Unlock returns
		})
	default:
		ft := hlc.Timestamp{}
		if s.cfg.fenceKey {
			ft = token
		}
		if handover && watches(first.told) {
			turn(hlc.Timestamp{})
		}
		s.request(n, func() error { _, err := s.st.vdel(simName, rec, ft); return err }, func(error) {
			if handover && !watches(first.told) {
				turn(hlc.Timestamp{})
			}
			s.think(n) // Unlock returns
		})
	}
}

// fault injects one fault, drawn at random.
func (s *sim) fault() {
	s.faults++
	s.lastFault = s.now
	n := s.nodes[s.rng.IntN(len(s.nodes))]
	switch r := s.rng.IntN(10); {
	case r < 3: // pause
		if n.phase != phCrashed && s.now >= n.pausedUntil {
			d := time.Duration(s.rng.IntN(int(2 * simTTL)))
			n.pausedUntil = s.now + d
			s.logf("%s paused for %v", n.id, d)
			s.at(d, func() { s.resume(n) })
		}
	case r < 6: // lost connection
		if n.phase != phCrashed {
			s.reconnect(n)
		}
	case r < 8: // crash, and restart later
		if n.phase != phCrashed && n.phase != phDone {
			s.logf("%s crashes", n.id)
			for _, k := range []string{simName, simName + queueSuffix, simName + InboxInfix + n.id} {
				s.st.unwatch(n.conn, k)
			}
			for s.st.pending(n.conn) > 0 {
				s.st.pop(n.conn)
			}
			if n.phase == phWaiting || n.phase == phHolding {
				n.cycle-- // that cycle is done again by the next incarnation
			}
			n.phase = phCrashed
			n.inc++ // its scheduled work is void
			n.pausedUntil, n.parked = 0, nil
			s.at(time.Duration(s.rng.IntN(int(2*simTTL))), func() { s.boot(n) })
		}
	default: // store restart
		s.logf("store restarts")
		s.st.restart()
		s.restarted = s.now
		for _, o := range s.nodes {
			if o.phase != phCrashed {
				s.lostConn(o)
			}
		}
		s.flush()
	}
}

// reconnect makes n lose its connection: answers in flight are lost, and
// its watches resync.
func (s *sim) reconnect(n *simPart) {
	s.logf("%s loses its connection", n.id)
	s.st.reconnect(n.conn)
	s.lostConn(n)
	s.flush()
}

func (s *sim) lostConn(n *simPart) {
	// Answers in flight are lost (request answers errSimLost).
	n.epoch++
	n.scheduled = 0
	n.holdOff = s.now + simTTL
	n.confirm = true
	for _, w := range s.nodes {
		if w.phase == phWaiting {
			w.lostPlace = true
		}
	}
}

func (s *sim) resume(n *simPart) {
	if s.now < n.pausedUntil {
		return
	}
	parked := n.parked
	n.parked = nil
	for _, fn := range parked {
		fn()
	}
}

// run runs the simulation to its end, and returns the first violation.
func (s *sim) run() error {
	limit := 200 * simTTL
	if s.cfg.faults {
		flapOnly := s.rng.IntN(4) == 0
		nf := 1 + s.rng.IntN(4)
		for range nf {
			if !flapOnly {
				s.at(time.Duration(s.rng.IntN(int(3*simTTL))), s.fault)
			}
		}
		if flapOnly || s.rng.IntN(3) == 0 {
			// Some participants' connection flaps (they share a client):
			// lost every 0.3 to 0.7 TTL, for up to 8 TTLs.
			var fs []*simPart
			for _, i := range s.rng.Perm(len(s.nodes))[:1+s.rng.IntN(len(s.nodes)-1)] {
				fs = append(fs, s.nodes[i])
			}
			if flapOnly {
				s.flappers = fs
			}
			at, end := time.Duration(0), time.Duration(s.rng.IntN(int(8*simTTL)))
			for at < end {
				at += 3*simTTL/10 + time.Duration(s.rng.IntN(int(4*simTTL/10)))
				s.at(at, func() {
					s.faults++
					s.lastFault = s.now
					for _, f := range fs {
						if f.phase != phCrashed {
							s.reconnect(f)
						}
					}
				})
			}
		}
	}
	for s.events.Len() > 0 && s.err == nil {
		e := heap.Pop(&s.events).(simEvent)
		if e.at > limit {
			break
		}
		if e.at > s.now {
			s.now = e.at
			s.st.advance(s.now)
			s.flush()
		}
		e.fn()
		if exp, ok := s.st.nextExpiry(); ok && exp > s.now && !s.expiry[exp] {
			s.expiry[exp] = true
			s.at(exp-s.now, func() { delete(s.expiry, exp) })
		}
		if s.done() {
			break
		}
	}
	if s.err != nil {
		return s.err
	}
	if !s.done() {
		var b strings.Builder
		for _, n := range s.nodes {
			fmt.Fprintf(&b, " %s:%d/%d(%v %s/%s)", n.id, n.cycle, s.cfg.cycles, n.phase, n.c.keeper, n.c.w.role)
		}
		return fmt.Errorf("seed %d: not every waiter acquired by %v:%s", s.seed, s.now, b.String())
	}
	return nil
}

// done reports whether every participant finished its cycles.
func (s *sim) done() bool {
	for _, n := range s.nodes {
		if n.phase != phDone {
			return false
		}
	}
	return true
}

var simEvNames = [...]string{"inbox", "roll", "key", "keyEnded", "watched", "unwatched", "start", "leave", "acquired", "rollDue", "grace", "recheck", "ended", "keptLost", "release", "turnOut", "heldOff"}

func (k qevKind) String() string { return simEvNames[k] }

// describe is ev for the trace.
func (ev qevent) describe() string {
	switch ev.kind {
	case evInbox, evRoll:
		if len(ev.value) == 0 {
			return fmt.Sprintf("%v resync=%v", ev.kind, ev.resync)
		}
		return fmt.Sprintf("%v %q v=%v resync=%v", ev.kind, ev.value, ev.version, ev.resync)
	case evKey:
		return fmt.Sprintf("key %v %q v=%v resync=%v", ev.key.Op, ev.key.Value, ev.key.Version, ev.key.Resync)
	}
	return ev.kind.String()
}
