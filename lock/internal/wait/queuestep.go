package wait

import (
	"bytes"
	"slices"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/sskv"
)

// This file is the queue's state machine, as docs/design/queue.md specifies
// it: the state of one Lock's part in its lock's queue, and the pure
// functions that change it. It does no I/O, starts nothing and reads no
// clock: step applies one event at a given time and returns the messages to
// send; next returns the waiter's next action. queue.go and Waiter.queued
// do the I/O; the simulation (queuesim_test.go) drives the same code.

// keeperRole is what a Lock does with the queue it keeps (queue.md 3.1).
type keeperRole uint8

const (
	keepNone      keeperRole = iota // keeps no queue: Lingering, or HandedOn while forward is set
	keepHolding                     // holds the key and keeps the queue
	keepPartial                     // holds the key without having been handed the queue: a roll call is due
	keepReleasing                   // released: keeps what arrives until the turn goes to handTo
)

// waiterRole is where a Lock's wait stands (queue.md 3.1).
type waiterRole uint8

const (
	waitNone        waiterRole = iota // not waiting
	waitStart                         // to join: the Lock it handed the queue to (forward), else the holder it reads
	waitJoin                          // to read the holder and join it (its place may be lost)
	waitOwn                           // the key holds its own earlier record: it watches it go
	waitUnconfirmed                   // joined to, not confirmed: watches the key
	waitQueued                        // confirmed: sleeps
	waitFirst                         // told to watch the key as the first waiter
	waitSecond                        // told to watch the key behind ahead
	waitTold                          // told the key expired with it first: takes it at once
	waitTurned                        // the lock was released to it
)

var waiterRoleNames = [...]string{"none", "start", "join", "own", "unconfirmed", "queued", "first", "second", "told", "turned"}

func (r waiterRole) String() string { return waiterRoleNames[r] }

var keeperRoleNames = [...]string{"none", "holding", "partial", "releasing"}

func (r keeperRole) String() string { return keeperRoleNames[r] }

// waiterState is a waiter's part. Fields other than role mean something
// only in the roles their comments name.
type waiterState struct {
	role     waiterRole
	to       string        // unconfirmed, queued, first, second, told, join: whom its join went to
	joinedAt time.Time     // unconfirmed: when
	ahead    []string      // second: the waiters ahead of it, less those seen take the key
	token    hlc.Timestamp // turned: the reservation's version (FenceKey), or zero
	watch    bool          // turned, told: it watched the key when it got there
	moved    bool          // turned: the key was freed, or changed hands, since the turn came
	resynced bool          // turned: its inbox missed messages; it takes the key as partial (a roll call due)
	prev     waiterRole    // told: where it goes back to if the key was taken meanwhile
	merge    bool          // waiting: what it keeps goes to to once confirmed (it lost a turn, or one came late)
	rejoined bool          // queued: joined forward without an answer yet; a watch it has is kept until told
	// The grace a freed key waits for the turn (D4, D10): armed, and passed.
	graceArmed, graced bool
	graceGen           uint64
}

// keyView is what the watch of the lock's key has told.
type keyView struct {
	watching bool
	known    bool // it told the key's state (or an attempt found it held)
	free     bool // last seen deleted
	held     bool // seen held at some point
	changed  bool // since the last look
	expired  bool // deleted long after its last write
	value    []byte
	version  hlc.Timestamp
	lastSet  time.Time // last seen written, or first watched
	unseen   time.Time // a Resync found missing the key seen held
	seq      uint64    // counts what the watch told
	looked   uint64    // seq at the last look
}

// qcore is a Lock's state in its lock's queue.
type qcore struct {
	self     string
	rec      []byte // the Lock's acquisition record: the caller keeps it current
	ttl      time.Duration
	fenceKey bool
	// keepWatch: a watch of the key is kept while the queue lives, from
	// an acquisition until a wait no longer needs it, so that a Lock that
	// locks again after a handover (the common case) costs no KEYNOTIFY,
	// GET or STOP. Not with FenceKey, whose holding's guard takes the
	// waiter's watch over.
	keepWatch bool

	ended   bool
	lastMsg hlc.Timestamp

	keeper    keeperRole
	entries   []entry // the queue it keeps (keeping, releasing), or was handed or told while waiting
	forward   string  // the Lock it handed the queue to
	handTo    entry   // releasing: the first waiter, whom the release is for
	heldToken hlc.Timestamp
	relToken  hlc.Timestamp // the holding whose release gave it its turn
	// relayed: when, and to whom, it last relayed a leave ("-" id) or
	// forwarded the entry ("+" id) of each waiter. Locks that handed on to
	// each other in a ring would pass them round for ever (W14, W19):
	// each relays a waiter's leave once a TTL, and hands the turn to
	// entries that come back from the Lock it forwarded them to, rather
	// than forward them again. "roll" keys its last empty roll call
	// (evHeldOff).
	relayed    map[string]relayed
	now        time.Time // of the step under way
	viaForward bool      // the step handles a msgForward

	w         waiterState
	key       keyView
	holdUntil time.Time // no attempt on a missing key before (a Resync found it gone)
}

// qsend is one write the queue asks for.
type qsend struct {
	to   string // the inbox it goes to; with roll, the roll-call key
	roll bool
	msg  []byte // nil: none
	// give, if not zero: first delete the key if it holds this Lock's
	// record reserved with version give (VDEL fenced with it); then send
	// msg.
	give hlc.Timestamp
	// turn: the give runs with the Lock's turn, ordered with its own
	// acquisitions (S3, Lease.WithTurn): the reservation may have expired,
	// and the Lock be between the two SETs of its own take of the key.
	turn bool
}

// qevKind is the kind of a qevent.
type qevKind uint8

const (
	evInbox     qevKind = iota // a message in its inbox: value, version, resync
	evRoll                     // the roll call: value
	evKey                      // a notification of the lock's key: the event
	evKeyEnded                 // the watch of the key ended
	evWatched                  // a watch of the key started
	evUnwatched                // the watch of the key was stopped
	evStart                    // a wait begins
	evLeave                    // the wait ends without the lock
	evAcquired                 // the wait took the key: partial, token
	evRollDue                  // rollGrace after a partial acquisition
	evGrace                    // the grace timer fired: gen
	evRecheck                  // the safeguard recheck fired
	evEnded                    // the queue's watches ended
	evKeptLost                 // a wait begins after a holding ended without handing over
	evRelease                  // the holding is being released: handTo is then the first waiter, if any
	evTurnOut                  // the release is done: send the turn, with the reservation's version (token)
	evHeldOff                  // the waiter's attempt is held off by its connection's outage
)

// qevent is an event of step.
type qevent struct {
	kind    qevKind
	value   []byte
	version hlc.Timestamp
	resync  bool
	key     sskv.Event
	partial bool
	token   hlc.Timestamp
	gen     uint64
}

// step applies ev at now and returns the writes it asks for.
func (c *qcore) step(now time.Time, ev qevent) []qsend {
	c.now = now
	var out []qsend
	switch ev.kind {
	case evInbox:
		out = c.onInbox(now, ev)
	case evRoll:
		c.onRoll(ev.value)
	case evKey:
		out = c.onKey(now, ev.key)
	case evKeyEnded, evUnwatched:
		c.key.watching = false
	case evWatched:
		k := &c.key
		k.watching, k.changed, k.seq = true, true, k.seq+1
		k.free, k.value, k.lastSet, k.known = false, nil, now, false
	case evStart:
		c.w = waiterState{role: waitStart}
	case evLeave:
		out = c.leave()
	case evAcquired:
		out = c.acquired(ev.partial, ev.token)
	case evRollDue:
		if c.keeper == keepPartial && !c.ended {
			c.keeper = keepHolding
			out = append(out, c.rollCall())
		}
	case evGrace:
		if c.w.graceArmed && ev.gen == c.w.graceGen {
			c.w.graced = true
		}
	case evRecheck:
		if c.w.role == waitTurned {
			// The delete it waits for may have been lost (queue.md W9):
			// attempt, and wait for the delete again if the key is held.
			c.key.known = false
		}
		c.rejoin()
	case evEnded:
		c.ended = true
		if c.keeper == keepHolding || c.keeper == keepPartial {
			break
		}
		// What it was told goes on to where it belongs.
		if c.w.role == waitTurned {
			out = c.handOn(c.w.token)
		} else {
			c.w = waiterState{}
			out = c.settle()
		}
		c.w = waiterState{}
	case evRelease:
		out = c.handOver()
	case evTurnOut:
		out = c.turnMsg(ev.token)
	case evHeldOff:
		// A turned waiter whose connection came back after an outage may
		// not take a missing key for a TTL (a reconnect's hold-off), and
		// a connection that keeps failing would hold the turn, and every
		// waiter behind it, for as long (W18): if others wait, the turn
		// and the queue go on to the first of them, and it joins again.
		// The caller runs the sends at once: it has the Lock's turn.
		switch {
		case c.w.role == waitTurned && len(c.entries) > 0:
			out = c.handOn(c.w.token)
			c.w = waiterState{role: waitStart}
		case c.waiting() && c.relay(now, "roll"):
			// It would take a free key and may not: the waiters that wait
			// on it, or on a turn lost with the outage, may not know. An
			// empty roll call, once a TTL, sends every waiter to read the
			// key and join again; one whose connection is sound takes it
			// (W21).
			out = append(out, qsend{roll: true, msg: []byte{msgRoll}})
		}
	case evKeptLost:
		if c.keeper == keepHolding || c.keeper == keepPartial {
			out = c.handOver()
			out = append(out, c.turnMsg(hlc.Timestamp{})...)
		}
	}
	return out
}

// waiting reports whether a wait is under way.
func (c *qcore) waiting() bool { return c.w.role != waitNone }

// holds reports whether it holds the key, as keeper.
func (c *qcore) holds() bool { return c.keeper == keepHolding || c.keeper == keepPartial }

// rejoin makes a waiter without the turn read the holder and join again.
// The Lock it handed the queue to, if any, is forgotten: its place there
// is lost, so that Lock may be gone, and a later wait must not join it
// again without a read (W15).
func (c *qcore) rejoin() {
	if c.w.role != waitNone && c.w.role != waitTurned {
		c.forward = ""
	}
	switch c.w.role {
	case waitNone, waitTurned:
	case waitTold:
		c.w.prev = waitJoin
	default:
		c.w.role, c.w.ahead = waitJoin, nil
	}
}

// joined records that its join went to id ("": none, join again), as
// confirmed if acked.
func (c *qcore) joined(now time.Time, id string, acked bool) {
	w := &c.w
	w.to, w.ahead, w.joinedAt = id, nil, now
	switch {
	case id == "":
		w.role = waitStart
	case id == c.self:
		w.role = waitOwn
	case acked:
		w.role = waitQueued
	default:
		w.role = waitUnconfirmed
	}
}

func (c *qcore) onInbox(now time.Time, ev qevent) []qsend {
	if ev.resync {
		// Messages may have been missed. A waiter reads the holder and
		// joins again (a holder keeps one place per waiter). A keeper, or
		// a waiter that has the turn (the keeper to be), may have missed
		// entries sent to it (a forward, a rejoin: confirmed, those
		// waiters do not watch the key): it calls the roll, as a holder
		// that was not handed the queue does (W22). A join it missed was
		// not confirmed: its waiter watches the key (W2).
		switch {
		case c.holds():
			c.keeper = keepPartial
		case c.w.role == waitTurned:
			c.w.resynced = true
		default:
			c.rejoin()
		}
	}
	if len(ev.value) == 0 || !ev.version.After(c.lastMsg) {
		return nil
	}
	c.lastMsg = ev.version
	kind, body := ev.value[0], ev.value[1:]
	w := &c.w
	var out []qsend
	switch kind {
	case msgJoin, msgRejoin:
		id := lease.ParseHolder(body, hlc.Timestamp{}).ID
		if id == "" || id == c.self {
			return nil
		}
		told := byte(toldNothing)
		if kind == msgRejoin {
			told = toldAck
		}
		c.add([]entry{{id: id, rec: bytes.Clone(body), told: told, ver: ev.version}})
	case msgForward:
		es, ok := parseEntries(body)
		if !ok {
			return nil
		}
		stamp(es, ev.version)
		c.add(es)
		c.viaForward = true
		defer func() { c.viaForward = false }()
	case msgLeave, msgRelay:
		v, rec := ev.version, body
		if kind == msgRelay {
			var ok bool
			if v, rec, ok = parseRelay(body); !ok {
				return nil
			}
		}
		id := lease.ParseHolder(rec, hlc.Timestamp{}).ID
		if i := slices.IndexFunc(c.entries, func(e entry) bool { return e.id == id }); i >= 0 {
			if !c.entries[i].ver.After(v) {
				out = c.remove(i)
			}
			// Else it joined again after it left: the leave is late.
		} else if c.forward != "" && !c.holds() && c.relay(now, "-"+id) {
			// It went to a Lock that handed the queue on: on to where the
			// entry went, so that its keeper tells the watchers (msgLeft).
			out = append(out, qsend{to: c.forward, msg: relayBody(v, rec)})
		}
	case msgHead:
		if len(body) >= 1 && (body[0] == toldFirst || body[0] == toldSecond) {
			switch w.role {
			case waitUnconfirmed, waitQueued, waitFirst, waitSecond:
				w.role, w.ahead = waitFirst, nil
				if body[0] == toldSecond {
					if w.ahead = parseIDs(body[1:]); len(w.ahead) > 0 {
						w.role = waitSecond
					}
				}
			}
		}
	case msgAck:
		// Queued, and not among the watchers: it no longer watches the key.
		switch w.role {
		case waitUnconfirmed, waitFirst, waitSecond, waitQueued:
			w.role, w.ahead, w.rejoined = waitQueued, nil, false
		}
	case msgLeft:
		if i := slices.Index(w.ahead, string(body)); i >= 0 && w.role == waitSecond {
			if w.ahead = slices.Delete(w.ahead, i, i+1); len(w.ahead) == 0 {
				w.role = waitFirst // it is the first now
			}
		}
	case msgExpired:
		v, ids, ok := parseExpired(body)
		switch {
		case !ok || c.keeper != keepNone || !v.After(c.heldToken):
			// It has held the lock since: the message is late.
		case c.waiting() && w.role != waitTurned && w.role != waitTold:
			// The holder is gone, and this waiter is the first: it takes
			// the key at once.
			w.prev, w.watch, w.role = w.role, c.watchesKey(), waitTold
		case !c.waiting() && len(ids) > 0:
			// It gave up: the next one is the first.
			out = append(out, qsend{to: ids[0], msg: expiredBody(v, ids[1:])})
		}
	case msgTurn:
		token, rel, es, ok := parseTurn(body)
		if !ok {
			return nil
		}
		stamp(es, ev.version)
		c.entries = mergeEntries(c.self, es, c.entries)
		switch {
		case c.holds():
			// It took the key before the turn came: the queue it was
			// handed comes before whoever joined it since.
			c.keeper = keepHolding
		case c.keeper == keepReleasing:
			// A turn from a newer holding (its reservation was taken
			// before its release's answer came): its queue is kept and
			// handed on with the release's turn, as from that holding, or
			// the next would judge the turn late.
			if rel.After(c.relToken) {
				c.relToken = rel
			}
		case !rel.IsZero() && c.heldToken.After(rel):
			// From a holding older than its own: it came after this Lock
			// had taken the key. Its queue goes where this Lock's goes.
			// (A turn from its own last holding is its own release's,
			// passed back by Locks that no longer wait: it is taken.)
			// The turn used up its place in its sender's queue (it was
			// that queue's first), which may be the one it joined: it
			// joins again.
			if c.waiting() {
				w.merge = true
				c.rejoin()
				break
			}
			// Not waiting: the turn goes on to the first, whatever the
			// Lock it handed on to does (they may have handed to each
			// other: forwarding would bounce the queue between them).
			c.forward = ""
			return c.handOn(hlc.Timestamp{})
		case !c.waiting():
			// It gave up: the turn, and the queue, go to the first.
			c.relToken, c.forward = rel, ""
			return c.handOn(token)
		default:
			watch := c.watchesKey()
			c.relToken, c.forward = rel, ""
			*w = waiterState{role: waitTurned, token: token, watch: watch, to: w.to}
		}
	}
	return append(out, c.settle()...)
}

// stamp gives entries that came in a message of version v that version as
// their join's: their joins were no later, and a leave older than the
// message may be of an earlier wait (W17). A leave of the same wait that
// crossed it then costs a hop (its turn reaches a Lock that no longer
// waits, which hands it on), not a waiter's place.
func stamp(es []entry, v hlc.Timestamp) {
	for i := range es {
		es[i].ver = v
	}
}

// relayed is when, and to whom, a leave or an entry was passed on.
type relayed struct {
	at time.Time
	to string
}

// relay reports whether what key names (see qcore.relayed) may be passed
// on to c.forward now, and records it: not if it was passed on to the same
// Lock within a TTL.
func (c *qcore) relay(now time.Time, key string) bool {
	if r, ok := c.relayed[key]; ok && now.Sub(r.at) < c.ttl && r.to == c.forward {
		return false
	}
	for k, r := range c.relayed {
		if now.Sub(r.at) >= c.ttl {
			delete(c.relayed, k)
		}
	}
	if c.relayed == nil {
		c.relayed = make(map[string]relayed)
	}
	c.relayed[key] = relayed{at: now, to: c.forward}
	return true
}

// add appends the waiters es that are not queued yet, keeping the place of
// those that are.
func (c *qcore) add(es []entry) {
	for _, e := range es {
		if e.id == c.self {
			// Its own place, passed around while it waits (messages
			// crossed): it may have no other, so it joins again rather
			// than wait for its safeguard check.
			c.rejoin()
			continue
		}
		if i := slices.IndexFunc(c.entries, func(x entry) bool { return x.id == e.id }); i >= 0 {
			if e.told == toldNothing {
				// It asks again: tell it again, keeping its place.
				c.entries[i].told = toldNothing
			}
			if e.ver.After(c.entries[i].ver) {
				c.entries[i].ver = e.ver
			}
			continue
		}
		c.entries = append(c.entries, e)
	}
}

// remove takes the waiter at i out of the queue: a keeper tells the
// watchers of the key behind it, which were told it was ahead of them.
func (c *qcore) remove(i int) []qsend {
	var out []qsend
	if c.keeper != keepNone {
		for _, e := range c.entries[i+1:] {
			if watches(e.told) {
				out = append(out, qsend{to: e.id, msg: append([]byte{msgLeft}, c.entries[i].id...)})
			}
		}
	}
	c.entries = slices.Delete(c.entries, i, i+1)
	return out
}

// settle does what this Lock owes the entries it keeps (queue.md 4.1).
func (c *qcore) settle() []qsend {
	var out []qsend
	w := &c.w
	switch {
	case c.keeper != keepNone:
		// keyWatchers waiters watch the key, taken from the back so that a
		// handover seldom needs a new one; the others are confirmed.
		watchers := 0
		for _, e := range c.entries {
			if watches(e.told) {
				watchers++
			}
		}
		for i := len(c.entries) - 1; i >= 0 && watchers < keyWatchers; i-- {
			if e := &c.entries[i]; !watches(e.told) {
				e.told = toldSecond
				if i == 0 {
					e.told = toldFirst
				}
				ids := make([]string, i)
				for j, a := range c.entries[:i] {
					ids[j] = a.id
				}
				out = append(out, qsend{to: e.id, msg: appendIDs([]byte{msgHead, e.told}, ids)})
				watchers++
			}
		}
		out = append(out, c.ackAll()...)
	case w.role == waitTurned:
		// Once the lock is released to it, it confirms what it keeps: an
		// unconfirmed waiter would take the key at the next release.
		out = c.ackAll()
	case c.waiting():
		if w.merge && len(c.entries) > 0 && (w.role == waitQueued || w.role == waitFirst || w.role == waitSecond) {
			// It waits in another's queue: what it keeps goes there too,
			// to be told its place afresh.
			for i := range c.entries {
				c.entries[i].told = toldNothing
			}
			out = append(out, qsend{to: w.to, msg: appendEntries([]byte{msgForward}, c.entries)})
			c.entries = nil
		}
		// Otherwise it keeps them, unconfirmed: they watch the key.
	case c.forward != "":
		back := false
		for _, e := range c.entries {
			if !c.relay(c.now, "+"+e.id) && c.viaForward {
				back = true // forwarded back by the Lock it forwarded it to: they go round
			}
		}
		if back {
			c.forward = ""
			out = c.handOn(hlc.Timestamp{})
		} else if len(c.entries) > 0 {
			out = append(out, qsend{to: c.forward, msg: appendEntries([]byte{msgForward}, c.entries)})
			c.entries = nil
		}
	default:
		out = c.handOn(hlc.Timestamp{})
	}
	return out
}

// ackAll confirms every entry not told anything yet.
func (c *qcore) ackAll() []qsend {
	var out []qsend
	for i := range c.entries {
		if e := &c.entries[i]; e.told == toldNothing {
			e.told = toldAck
			out = append(out, qsend{to: e.id, msg: []byte{msgAck}})
		}
	}
	return out
}

// handOn gives the lock's turn to the first entry, the queue with it, and
// forgets the queue. reservation: the key is reserved for this Lock, which
// gives it back first.
func (c *qcore) handOn(reservation hlc.Timestamp) []qsend {
	s := qsend{give: reservation, turn: true}
	if len(c.entries) > 0 {
		s.to, s.msg = c.entries[0].id, turnBody(hlc.Timestamp{}, c.lastRelease(), c.entries[1:])
		c.forward, c.entries = s.to, nil
	}
	if s.msg == nil && s.give.IsZero() {
		return nil
	}
	return []qsend{s}
}

// lastRelease is the token of the newest holding whose release this Lock
// knows the queue follows: its own, or the one whose turn it got.
func (c *qcore) lastRelease() hlc.Timestamp {
	if c.relToken.After(c.heldToken) {
		return c.relToken
	}
	return c.heldToken
}

func (c *qcore) rollCall() qsend {
	return qsend{roll: true, msg: appendEntries([]byte{msgRoll}, c.entries)}
}

// onRoll: a waiter the roll call does not list joins again.
func (c *qcore) onRoll(v []byte) {
	if len(v) == 0 || v[0] != msgRoll {
		return
	}
	es, ok := parseEntries(v[1:])
	if !ok || !c.waiting() || c.w.role == waitTurned || c.w.role == waitTold {
		return
	}
	if !slices.ContainsFunc(es, func(e entry) bool { return e.id == c.self }) {
		c.rejoin()
	}
}

// onKey records a notification of the lock's key.
func (c *qcore) onKey(now time.Time, ev sskv.Event) []qsend {
	k := &c.key
	if !k.watching {
		return nil
	}
	k.changed, k.known = true, true
	k.seq++
	if ev.Op == sskv.OpDelete {
		if ev.Resync && k.held {
			// The key may have vanished unseen (a store restart) while its
			// holder still counts on it: hold off a TTL.
			k.unseen = now
		}
		// A release comes within a renewal interval of the last write; an
		// expiry a TTL after it.
		k.expired = now.Sub(k.lastSet) > c.ttl/2
		k.free, k.value = true, nil
		if c.w.role == waitTurned {
			c.w.moved = true
		}
		if k.expired && !ev.Resync && !ev.Version.IsZero() && c.w.role == waitSecond && len(c.w.ahead) > 0 {
			// The holder is gone, and the first waiter may not watch the
			// key: tell it. Not after a Resync (the key may have vanished
			// unseen: the watchers hold off).
			return []qsend{{to: c.w.ahead[0], msg: expiredBody(ev.Version, c.w.ahead[1:])}}
		}
		return nil
	}
	if c.w.role == waitTurned && k.value != nil && !bytes.Equal(k.value, ev.Value) {
		c.w.moved = true // another holder's record: not a renewal
	}
	k.lastSet = now
	k.free, k.held = false, true
	k.value, k.version = bytes.Clone(ev.Value), ev.Version
	if len(c.w.ahead) > 0 {
		// A waiter ahead took the key: those before it were served.
		if i := slices.Index(c.w.ahead, lease.ParseHolder(ev.Value, ev.Version).ID); i >= 0 {
			if c.w.ahead = c.w.ahead[i+1:]; len(c.w.ahead) == 0 && c.w.role == waitSecond {
				c.w.role = waitFirst
			}
		}
	}
	return nil
}

// watchesKey reports whether this Lock should watch the lock's key.
func (c *qcore) watchesKey() bool {
	keep := c.keepWatch && c.key.watching // kept if it has one, not started
	if c.holds() {
		return keep
	}
	switch c.w.role {
	case waitStart:
		// A rejoin of forward is confirmed without a watch: the Lock it
		// joins tells it to watch (msgHead), or not (msgAck).
		return c.forward == "" || keep
	case waitQueued:
		return c.w.rejoined && keep
	case waitJoin, waitOwn, waitUnconfirmed, waitFirst, waitSecond:
		return true
	case waitTurned, waitTold:
		return c.w.watch
	}
	return false
}

// leave ends the wait without the lock: it tells the Lock it joined, or
// hands on the turn or the queue it was handed.
func (c *qcore) leave() []qsend {
	w := c.w
	if w.role == waitNone {
		return nil
	}
	c.w = waiterState{}
	switch {
	case w.role == waitTurned:
		return c.handOn(w.token)
	case len(c.entries) > 0:
		return c.handOn(hlc.Timestamp{})
	case w.to != "" && w.to != c.self:
		return []qsend{{to: w.to, msg: append([]byte{msgLeave}, c.rec...)}}
	}
	return nil
}

// acquired makes this Lock the keeper: it holds the key. partial: it took a
// key whose holder went without handing the queue over; it calls the roll
// unless a turn comes within rollGrace (evRollDue).
func (c *qcore) acquired(partial bool, token hlc.Timestamp) []qsend {
	c.heldToken, c.relToken = token, hlc.Timestamp{}
	c.keeper = keepHolding
	if partial {
		c.keeper = keepPartial
	}
	c.w, c.forward = waiterState{}, ""
	return c.settle()
}

// handOver ends the keeping of the queue, at a release: handTo is then the
// first waiter, if there is one (keeper releasing).
func (c *qcore) handOver() []qsend {
	var out []qsend
	if c.keeper == keepPartial {
		// Released before its roll call: call it now.
		out = append(out, c.rollCall())
	}
	c.keeper, c.handTo = keepNone, entry{}
	if len(c.entries) == 0 {
		c.forward = ""
		return out
	}
	c.keeper, c.handTo = keepReleasing, c.entries[0]
	return out
}

// turnMsg hands the lock and the rest of the queue to the first waiter,
// after the release, with the reservation's version (zero without one).
func (c *qcore) turnMsg(token hlc.Timestamp) []qsend {
	if c.keeper == keepReleasing && !token.IsZero() {
		// The turn goes to the waiter the reservation names, whatever came
		// in meanwhile.
		c.entries = mergeEntries(c.self, []entry{c.handTo}, c.entries)
	}
	if c.keeper == keepReleasing {
		c.keeper = keepNone
	}
	c.handTo = entry{}
	if len(c.entries) == 0 {
		return nil
	}
	first := c.entries[0]
	msg := turnBody(token, c.lastRelease(), c.entries[1:])
	c.forward, c.entries = first.id, nil
	return []qsend{{to: first.id, msg: msg}}
}

// qactKind is what a waiter does next (queue.md 4.3).
type qactKind uint8

const (
	actSleep   qactKind = iota // wait for an event
	actEnded                   // the queue's watches ended: engage again
	actWatch                   // watch the key (D1)
	actUnwatch                 // stop watching it (D2)
	actGrace                   // arm the grace timer for d (gen), then sleep
	actAttempt                 // take the key (fenced with ft unless zero), then attempted
	actRejoin                  // SET msgRejoin into to's inbox (recorded as joined)
	actGet                     // read the key, then got
	actJoin                    // SET msgJoin into to's inbox (recorded as joined)
)

// onHeld says what an attempt that does not take the key means.
type onHeld uint8

const (
	heldNothing  onHeld = iota // look again
	heldTurn                   // D5: a turn's attempt found the key held
	heldReserved               // D5: a reservation seen in the key
	heldTold                   // D6
	heldFree                   // D10
)

// qaction is a waiter's next action.
type qaction struct {
	kind    qactKind
	to      string
	ft      hlc.Timestamp
	partial bool
	d       time.Duration
	gen     uint64
	held    onHeld
	looked  uint64 // the key's seq at the look the attempt was decided by
	watched bool   // the key was watched at that look
	acked   bool   // D10: it was confirmed
}

// QueueGrace is how long a freed key waits for the turn before a waiter
// takes it itself (the second waiter: coverGrace).
func QueueGrace(ttl time.Duration) time.Duration {
	return min(max(ttl/100, 10*time.Millisecond), 50*time.Millisecond, ttl)
}

// coverGrace is how long the second waiter, covering for a first that may
// be gone, lets the turn come: longer than queueGrace, since taking the key
// while the turn is merely slow would split the queue.
func coverGrace(ttl time.Duration) time.Duration {
	return min(max(2*QueueGrace(ttl), min(ttl/10, time.Second)), ttl)
}

// next takes one look and returns the waiter's next action (queue.md 4.3:
// the first rule that matches).
func (c *qcore) next(now time.Time) qaction {
	for {
		if c.ended {
			return qaction{kind: actEnded}
		}
		k, w := &c.key, &c.w
		if !k.unseen.IsZero() && k.unseen.Add(c.ttl).After(c.holdUntil) {
			c.holdUntil = k.unseen.Add(c.ttl)
		}
		free := k.watching && k.free
		if k.changed && !free {
			w.graced, w.graceArmed = false, false
		}
		changed := k.changed
		k.changed, k.looked = false, k.seq
		watch := c.watchesKey()
		reserved := k.watching && k.value != nil && bytes.Equal(k.value, c.rec)
		turn := w.role == waitTurned
		switch {
		case w.role == waitNone:
			return qaction{kind: actSleep}
		case watch && !k.watching:
			// D1: watch the key before anything that decides by it.
			return qaction{kind: actWatch}
		case !watch && k.watching:
			return qaction{kind: actUnwatch} // D2
		case turn && !reserved && k.watching && k.known && !free && w.moved:
			// D3a: the key was freed or changed hands after the turn came,
			// and another holds it: the turn is lost. Join the holder, and pass it the queue
			// handed with the turn (settle), or the two queues would wait
			// on each other.
			*w = waiterState{role: waitJoin, to: w.to, merge: true}
			continue
		case turn && !reserved && k.watching && k.known && !free:
			// D3: the release's delete, sent before the turn, has yet to
			// reach the watch.
			return qaction{kind: actSleep}
		case reserved && !turn && !w.graced:
			// D4: its reservation is in; let the turn, which brings the
			// queue, come first.
			return c.arm(QueueGrace(c.ttl))
		case turn || reserved:
			// D5: the lock was released to it.
			w.graced, w.graceArmed = false, false
			a := qaction{kind: actAttempt, held: heldTurn, looked: k.seq, watched: k.watching, partial: w.resynced}
			if reserved {
				a.held = heldReserved
			}
			if c.fenceKey {
				a.ft = w.token
				if reserved {
					a.ft = k.version
				}
			}
			return a
		case w.role == waitTold:
			// D6: the key expired with it first: take it, as partial.
			return qaction{kind: actAttempt, partial: true, held: heldTold}
		case (w.role == waitUnconfirmed || w.role == waitOwn) && k.watching && k.value != nil &&
			lease.ParseHolder(k.value, k.version).ID != w.to:
			// D7: not confirmed, and the key went to another: join it.
			c.joined(now, "", false)
			continue
		case w.role == waitStart && c.forward != "":
			// D8: lock again after handing over: join the Lock it went to,
			// recorded first (the answer may beat the SET's).
			to := c.forward
			c.joined(now, to, true)
			w.rejoined = true
			return qaction{kind: actRejoin, to: to}
		case w.role == waitStart || w.role == waitJoin:
			return qaction{kind: actGet} // D9
		case free && (w.role == waitFirst || w.role == waitSecond || w.role == waitUnconfirmed || w.role == waitOwn):
			// D10: freed, and no turn yet. Unless the key expired, the
			// turn follows a release: let it come first.
			acked := w.role == waitFirst || w.role == waitSecond
			ignored := !acked && now.Sub(w.joinedAt) > QueueGrace(c.ttl)
			takeNow := changed && (ignored || (k.expired && (w.role == waitFirst || !acked)))
			if !takeNow && !w.graced {
				g := QueueGrace(c.ttl)
				if w.role == waitSecond {
					g = coverGrace(c.ttl)
				}
				return c.arm(g)
			}
			w.graced, w.graceArmed = false, false
			return qaction{kind: actAttempt, partial: acked, held: heldFree, acked: acked}
		}
		return qaction{kind: actSleep}
	}
}

// arm returns the action that arms the grace timer, once per freeing.
func (c *qcore) arm(d time.Duration) qaction {
	if c.w.graceArmed {
		return qaction{kind: actSleep}
	}
	c.w.graceArmed = true
	c.w.graceGen++
	return qaction{kind: actGrace, d: d, gen: c.w.graceGen}
}

// got applies the read of D9: the key's value and version (found false if
// missing). It returns what to do: attempt, join, or look again.
func (c *qcore) got(now time.Time, found bool, value []byte, version hlc.Timestamp) qaction {
	h := lease.ParseHolder(value, version)
	switch {
	case !found:
		return qaction{kind: actAttempt}
	case c.fenceKey && bytes.Equal(value, c.rec):
		// A reservation for this Lock (only FenceKey reserves).
		return qaction{kind: actAttempt, ft: version}
	case h.ID == c.self:
		// Its own earlier record, going: wait for the key.
		c.joined(now, c.self, false)
		return qaction{kind: actSleep}
	}
	c.joined(now, h.ID, false)
	return qaction{kind: actJoin, to: h.ID}
}

// attempted applies an attempt that did not take the key: held (the key is
// another's), or failed (an error; it is retried).
func (c *qcore) attempted(a qaction, failed bool) {
	w := &c.w
	switch a.held {
	case heldTurn:
		switch {
		case failed || w.role != waitTurned:
		case a.watched:
			// The delete is yet to come, or another took the key: wait for
			// its delete, unless the watch told something since the look
			// (a delete that came during the attempt is newer than what it
			// found).
			if c.key.watching && c.key.seq == a.looked {
				c.key.known, c.key.free, c.key.held = true, false, true
			}
		default:
			// Someone else took it: join them, then pass on the queue it
			// was handed (see settle).
			*w = waiterState{role: waitJoin, to: w.to, merge: true}
		}
	case heldTold:
		if !failed && w.role == waitTold {
			w.role = w.prev // someone took the key meanwhile
			w.prev, w.watch = waitNone, false
			if w.role == waitSecond && len(w.ahead) == 0 {
				w.role = waitFirst // it saw those ahead take the key meanwhile
			}
		}
	case heldFree:
		if !a.acked && w.role != waitTurned && w.role != waitTold && w.role != waitNone {
			c.joined(time.Time{}, "", false) // the holder kept no queue: join the next
		}
	}
}

// joinFailed records that the SET of a join did not go out: join again.
func (c *qcore) joinFailed() {
	switch c.w.role {
	case waitUnconfirmed, waitQueued, waitFirst, waitSecond:
		c.joined(time.Time{}, "", false)
	}
}
