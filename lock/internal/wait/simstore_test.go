package wait

import (
	"bytes"
	"fmt"
	"slices"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// This file is a model of the state store for a deterministic simulation of
// lock's wait queue: the store as lock sees it through sskv, with nothing
// concurrent, timed or random in it. Every call is applied atomically at the
// model's simulated time, which the caller sets (advance). The caller also
// decides when notifications reach a client (pop); the model only keeps
// each connection's notifications in the order the store made them.
//
// The rules are those of sskv/localstore (commands.go: execute, set, del,
// fenceCheck, live; notify.go; the expiry loop in requests.go), checked
// against it by TestSimStoreMatchesLocalStore:
//
//   - the fence is checked first, on every SET, DEL and VDEL of a key that
//     exists: a fenced key refuses a request without a token
//     (sskv.ErrFencingTokenRequired) or with a lower one
//     (sskv.ErrFencingTokenLower), whatever its condition or value;
//   - then NX (not applied if the key exists) and NEX (not applied if it
//     exists with another value); a SET not applied returns the stored
//     version and notifies nobody;
//   - an applied SET, even a NEX one rewriting the same value, takes a new
//     version, notifies every watcher, replaces the expiry (no TTL: none),
//     and with a token raises the fence (never lowers it);
//   - DEL and VDEL of a missing key, and VDEL of another value, change
//     nothing and notify nobody; a delete (DEL, VDEL, expiry) removes value
//     and fence, and notifies every watcher with a fresh version (the
//     service's time of the deletion);
//   - a key expires once the time reaches its deadline (SET time + TTL, in
//     whole milliseconds as sskv sends PX).
//
// Versions are HLC timestamps of node "sim": wall = simWallBase + the
// simulated time in milliseconds, and the counter for ties, so they strictly
// increase across everything, restarts included. Only their order means
// anything; the real store's differ in value.
//
// Not modelled: drift checks on __ts and __ft (a token from a version the
// model issued is never ahead), quotas, ACLs, persistence, the client's
// coalescing of events for a slow watcher (Config.WatchBuffer), the store
// dropping a client whose notifications pile up, redelivery over a resumed
// session (see reconnect), and a restarted store issuing versions below its
// predecessor's (the local store without persistence may, for a while: it
// starts again from its wall clock; sskv's forgetVersions is for that).

// simWallBase is the wall clock, in Unix milliseconds, at simulated time 0.
const simWallBase int64 = 1_700_000_000_000

// simNode is the node id of the versions the model issues.
const simNode = "sim"

// simStore is a model of the state store, as lock sees it: keys with values, versions, expiry and fences;
// SET with NX/NEX and fencing tokens; VDEL; KEYNOTIFY per connection with notifications in order; connection
// loss with the client's resync; restarts.
type simStore struct {
	t     time.Duration      // simulated time
	clock hlc.Timestamp      // the last version issued
	keys  map[string]*simKey // live keys
	// watches[conn][key] is conn's watch of key, with the state its client
	// was last given (Initial, or the last note popped): what a resync
	// compares the key's state with, as sskv's registration does.
	watches map[int]map[string]simNote
	queues  map[int][]simNote // per connection: notifications made, not yet delivered
}

// simKey is one live key.
type simKey struct {
	value    []byte
	version  hlc.Timestamp
	fence    hlc.Timestamp // zero: not fenced
	deadline time.Duration // 0: no expiry
}

// simNote is one notification as the sskv client delivers it to a watcher (see sskv.Event).
type simNote struct {
	Key     string
	Op      sskv.Op       // sskv.OpSet or sskv.OpDelete
	Value   []byte        // nil for OpDelete
	Version hlc.Timestamp // as sskv.Event.Version documents (zero for a missed delete reported by a Resync)
	Resync  bool
}

// String makes test failures readable.
func (n simNote) String() string {
	r := ""
	if n.Resync {
		r = " resync"
	}
	return fmt.Sprintf("%s %s %q %v%s", n.Key, n.Op, n.Value, n.Version, r)
}

// simSet are the options of a SET.
type simSet struct {
	Cond sskv.Condition // sskv.Always, sskv.IfNotExists, sskv.IfEqualOrNotExists
	TTL  time.Duration  // 0: no expiry
	FT   hlc.Timestamp  // fencing token; zero: none
}

func newSimStore() *simStore {
	return &simStore{
		keys:    map[string]*simKey{},
		watches: map[int]map[string]simNote{},
		queues:  map[int][]simNote{},
	}
}

func (s *simStore) now() time.Duration { return s.t }

// tick issues a new version: strictly after every earlier one.
func (s *simStore) tick() hlc.Timestamp {
	wall := simWallBase + s.t.Milliseconds()
	switch {
	case wall > s.clock.Wall:
		s.clock = hlc.Timestamp{Wall: wall, Node: simNode}
	case s.clock.Counter < hlc.MaxCounter:
		s.clock.Counter++
	default: // as hlc.Clock does: a full counter moves the wall on
		s.clock = hlc.Timestamp{Wall: s.clock.Wall + 1, Node: simNode}
	}
	return s.clock
}

// advance moves the clock to now (never backwards) and expires keys whose TTL has passed by then, notifying their
// watchers of the deletion as the real store does.
func (s *simStore) advance(now time.Duration) {
	for {
		d, ok := s.nextExpiry()
		if !ok || d > now {
			break
		}
		// Each key expires at its own deadline, so that its deletion's
		// version tells when. Keys due at the same time go in key order.
		s.t = max(s.t, d)
		var due []string
		for k, r := range s.keys {
			if r.deadline == d {
				due = append(due, k)
			}
		}
		slices.Sort(due)
		for _, k := range due {
			s.remove(k)
		}
	}
	s.t = max(s.t, now)
}

// nextExpiry is the earliest time a key expires (ok false if none): the simulator schedules an event for it.
func (s *simStore) nextExpiry() (time.Duration, bool) {
	var next time.Duration
	ok := false
	for _, r := range s.keys {
		if r.deadline != 0 && (!ok || r.deadline < next) {
			next, ok = r.deadline, true
		}
	}
	return next, ok
}

func (s *simStore) get(key string) (value []byte, version hlc.Timestamp, found bool) {
	r := s.keys[key]
	if r == nil {
		return nil, hlc.Timestamp{}, false
	}
	return bytes.Clone(r.value), r.version, true
}

// simFenceCheck applies the fence of r (nil: the key is missing) to a write
// with token ft (zero: none).
func simFenceCheck(r *simKey, ft hlc.Timestamp) error {
	switch {
	case r == nil || r.fence.IsZero():
		return nil
	case ft.IsZero():
		return sskv.ErrFencingTokenRequired
	case ft.Before(r.fence):
		return sskv.ErrFencingTokenLower
	}
	return nil
}

// set returns applied=false (not an error) when NX/NEX does not apply; err is sskv.ErrFencingTokenLower or
// sskv.ErrFencingTokenRequired exactly where the real store refuses with those (use the same sentinel errors sskv
// returns, so errors.Is works in lock's code).
// Options the sskv client refuses to send (an unknown condition, a TTL
// below 1 ms) give an error wrapping sskv.ErrInvalidOption.
func (s *simStore) set(key string, value []byte, o simSet) (applied bool, version hlc.Timestamp, err error) {
	if o.Cond > sskv.IfEqualOrNotExists || o.TTL < 0 || o.TTL > 0 && o.TTL < time.Millisecond {
		return false, hlc.Timestamp{}, fmt.Errorf("%w: simSet %+v", sskv.ErrInvalidOption, o)
	}
	r := s.keys[key]
	if err := simFenceCheck(r, o.FT); err != nil {
		return false, hlc.Timestamp{}, err
	}
	if r != nil && (o.Cond == sskv.IfNotExists || o.Cond == sskv.IfEqualOrNotExists && !bytes.Equal(r.value, value)) {
		return false, r.version, nil
	}
	if r == nil {
		r = &simKey{}
		s.keys[key] = r
	}
	r.value, r.version, r.deadline = bytes.Clone(value), s.tick(), 0
	if o.TTL > 0 {
		r.deadline = s.t + o.TTL.Truncate(time.Millisecond)
	}
	if o.FT.After(r.fence) {
		r.fence = o.FT
	}
	s.notify(simNote{Key: key, Op: sskv.OpSet, Value: r.value, Version: r.version})
	return true, r.version, nil
}

// vdel deletes key if it holds value (VDEL). deleted is false, with no
// error, when the key is missing or holds another value.
func (s *simStore) vdel(key string, value []byte, ft hlc.Timestamp) (deleted bool, err error) {
	return s.delete(key, true, value, ft)
}

// del deletes key as a DEL without a fencing token does: false when the key
// is missing, and also when it is fenced (the real store refuses that DEL
// with sskv.ErrFencingTokenRequired; delFT tells the two apart).
func (s *simStore) del(key string) bool {
	ok, _ := s.delete(key, false, nil, hlc.Timestamp{})
	return ok
}

// delFT is DEL with fencing token ft (zero: none).
func (s *simStore) delFT(key string, ft hlc.Timestamp) (deleted bool, err error) {
	return s.delete(key, false, nil, ft)
}

// delete runs DEL, or VDEL of value when cmp.
func (s *simStore) delete(key string, cmp bool, value []byte, ft hlc.Timestamp) (bool, error) {
	r := s.keys[key]
	if r == nil {
		return false, nil
	}
	if err := simFenceCheck(r, ft); err != nil {
		return false, err
	}
	if cmp && !bytes.Equal(r.value, value) {
		return false, nil
	}
	s.remove(key)
	return true, nil
}

// remove deletes key, value and fence, and notifies its watchers with the
// time of the deletion (the real store reads its clock only when someone
// watches; that changes no order).
func (s *simStore) remove(key string) {
	delete(s.keys, key)
	if s.watched(key) {
		s.notify(simNote{Key: key, Op: sskv.OpDelete, Version: s.tick()})
	}
}

func (s *simStore) watched(key string) bool {
	for _, w := range s.watches {
		if _, ok := w[key]; ok {
			return true
		}
	}
	return false
}

// notify queues n for every connection watching its key.
func (s *simStore) notify(n simNote) {
	for conn, w := range s.watches {
		if _, ok := w[n.Key]; ok {
			s.queues[conn] = append(s.queues[conn], n)
		}
	}
}

// state is key's state as an initial or resync event reports it.
func (s *simStore) state(key string) simNote {
	if r := s.keys[key]; r != nil {
		return simNote{Key: key, Op: sskv.OpSet, Value: r.value, Version: r.version}
	}
	return simNote{Key: key, Op: sskv.OpDelete}
}

// watch registers conn's KEYNOTIFY on key and returns the key's state at registration (the Initial event, as
// sskv delivers it: OpSet with value and version, or OpDelete with zero version if missing). unwatch removes it.
// Watching a key conn already watches changes nothing and returns the state
// its client was last given: in sskv, watchers of a key share its
// registration, and a new one starts from what that registration knows.
func (s *simStore) watch(conn int, key string) simNote {
	w := s.watches[conn]
	if w == nil {
		w = map[string]simNote{}
		s.watches[conn] = w
	}
	if last, ok := w[key]; ok {
		return last
	}
	w[key] = s.state(key)
	return w[key]
}

// unwatch ends conn's watch of key. Its notifications not yet delivered
// are dropped: the sskv client drops those of a key it no longer watches.
func (s *simStore) unwatch(conn int, key string) {
	delete(s.watches[conn], key)
	s.queues[conn] = slices.DeleteFunc(s.queues[conn], func(n simNote) bool { return n.Key == key })
}

// pending reports how many notifications wait for conn; pop takes the oldest (FIFO per connection, across all its
// keys, in the order the store made the changes).
func (s *simStore) pending(conn int) int { return len(s.queues[conn]) }

func (s *simStore) pop(conn int) (simNote, bool) {
	q := s.queues[conn]
	if len(q) == 0 {
		return simNote{}, false
	}
	n := q[0]
	s.queues[conn] = q[1:]
	s.watches[conn][n.Key] = n
	return n, true
}

// reconnect models conn losing its connection and the sskv client reconnecting: notifications not yet delivered are
// lost, every key conn watched is registered again, and each watcher gets what the sskv client delivers after a
// reconnect (read sskv/watchdelivery.go, sskv/watchregistry.go: a Resync event with the latest state where something may
// have been missed, and nothing where the state is what it last delivered). Track per (conn,key) the last state
// delivered (popped) to decide. Return nothing; the Resync notes go into conn's queue.
//
// As sskv's syncReg and Watcher.next decide: a key whose state has the
// existence and (when it exists) the version last delivered gets nothing;
// any other gets a Resync with its state, whose version is zero for a
// missing key (the GET that finds it missing gives no time of deletion).
// Keys are resynced in key order; the real client resyncs them
// concurrently, in no fixed order.
//
// Lost is what a connection whose session ends (a store restart, a session
// taken over or expired) does to its notifications. Over a cut connection
// whose MQTT session survives (sskv's default: 5 minutes), the broker sends
// again, after the reconnect, the notifications it had sent and not had
// acknowledged: the client gives those it routes before its resync starts
// as ordinary events (as pop before reconnect does here), and folds the
// rest into the Resync, whose OpDelete then carries the deletion's version,
// not zero. The model does not produce that non-zero version.
func (s *simStore) reconnect(conn int) {
	s.queues[conn] = nil
	w := s.watches[conn]
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		cur, last := s.state(k), w[k]
		if cur.Op != last.Op || cur.Op == sskv.OpSet && cur.Version != last.Version {
			cur.Resync = true
			s.queues[conn] = append(s.queues[conn], cur)
		}
	}
}

// restart models a store restart without persistence (what lock's keys see: they are not persisted): every key and
// fence is gone, every connection reconnects (as reconnect), and versions keep increasing.
// Keys vanish without notifications: the store that would send them is gone.
func (s *simStore) restart() {
	clear(s.keys)
	conns := make([]int, 0, len(s.watches)+len(s.queues))
	for c := range s.watches {
		conns = append(conns, c)
	}
	for c := range s.queues {
		conns = append(conns, c)
	}
	slices.Sort(conns)
	for _, c := range slices.Compact(conns) {
		s.reconnect(c)
	}
}
