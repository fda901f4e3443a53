package localstore

import (
	"bytes"
	"hash/maphash"
	"math"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// The key space is laid out for the garbage collector, which would otherwise
// scan every key on every cycle: a million keys as map entries pointing to
// structs holding strings, byte slices and times cost about 265 bytes each,
// and their pointers made every GC cycle walk them all.
//
// Instead each key is a record in a slab ([]record), a fixed-size struct
// without pointers, which the GC never scans. A record holds:
//
//   - where its key and value are in the arena, one []byte holding every
//     key followed by its value;
//   - its version, less the node id (every version is the store's, so its
//     node is the store clock's);
//   - its PX deadline, in monotonic nanoseconds since the table was made;
//   - its place in the expiry heap;
//   - the id of its owner (owners are interned: a store has few users);
//   - a 32-bit hash of its key.
//
// An open-addressing hash index ([]uint32 of slot+1, 0 for empty, linear
// probing with backward-shift deletion, so no tombstones) finds a key's
// record. Deleted records go on a free list for the next insert. What few
// keys have, fencing tokens (whose node is the client's), lives in a side
// map keyed by slot, with a flag bit in the record so that a key without a
// token costs no map lookup.
//
// The arena only grows by appending: a value that does not fit in its
// record's place is appended anew (with a copy of its key) and the old bytes
// become garbage. When garbage is more than half the arena it is compacted,
// which costs O(live bytes) and so is amortised over the writes that made
// that much garbage.

// record is one stored key. It holds no pointers (see above). It is 48 bytes.
type record struct {
	off      uint64 // arena[off:off+klen] is the key, the value follows it
	klen     uint32 // 0: a free slot (keys are never empty)
	vlen     uint32
	wall     int64  // version: wall clock (ms)
	counter  uint32 // version: logical counter; bit fencedBit: the key has a fencing token
	owner    uint32 // the owner's id in table.owners; bit persistedBit: the key is on disk
	deadline int64  // PX deadline, nanoseconds since table.epoch; 0: none
	heapIdx  int32  // position in the expiry heap, -1 when not in it
	hash     uint32 // low 32 bits of the key's hash
}

// fencedBit flags a record whose key has a fencing token in table.fences.
// Version counters are at most hlc.MaxCounter (MaxInt32), so the bit is free.
const fencedBit = 1 << 31

// persistedBit flags, in record.owner, a key that is on disk (see
// persist.go). Owner ids are few (one per user), so the bit is free.
const persistedBit = 1 << 31

// compactMin is the arena size below which it is never compacted: small
// stores would compact too often for nothing.
const compactMin = 1 << 20

// usage is what one user's keys take (see Config.MaxKeysPerUser).
type usage struct {
	keys  int
	bytes int64
}

// table is the key space with its expiry index and key watches. It is not
// safe for concurrent use: the Server guards it with its mutex. Slots are
// ints: -1 means no key. The byte slices key and value return alias the
// arena, valid until the next insert, update or removal.
type table struct {
	node  string    // the node id of every version: the store clock's
	epoch time.Time // deadlines count monotonic time from it
	seed  maphash.Seed

	recs    []record
	free    []uint32 // free slots of recs
	index   []uint32 // slot+1 of each key, 0: empty; len is a power of 2
	count   int      // keys stored
	arena   []byte
	garbage int // bytes of the arena no record uses

	fences   map[uint32]hlc.Timestamp // slot -> fencing token, for fenced keys only
	owners   []string                 // owner id -> user
	ownerIDs map[string]uint32        // user -> owner id
	expiry   []uint32                 // slots with a deadline, a min-heap on deadline
	removals uint64                   // keys removed so far (for tests: a slot may be reused)

	watches map[string]map[string]struct{} // key -> client ids
	byOwner map[string]map[string]struct{} // client id -> keys
	users   map[string]usage               // user -> its keys; no entry for a user without keys
}

func newTable(node string) *table {
	return &table{
		node:     node,
		epoch:    time.Now(),
		seed:     maphash.MakeSeed(),
		index:    make([]uint32, 16),
		fences:   make(map[uint32]hlc.Timestamp),
		ownerIDs: make(map[string]uint32),
		watches:  make(map[string]map[string]struct{}),
		byOwner:  make(map[string]map[string]struct{}),
		users:    make(map[string]usage),
	}
}

// len returns the number of keys stored.
func (t *table) len() int { return t.count }

// now returns the current monotonic time in the table's deadline unit.
func (t *table) now() int64 { return int64(time.Since(t.epoch)) }

// deadlineAfter returns the deadline d from now (never 0, saturating).
func (t *table) deadlineAfter(d time.Duration) int64 {
	now := t.now()
	if int64(d) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return max(now+int64(d), 1)
}

// untilDeadline returns the time from now to deadline d.
func (t *table) untilDeadline(d int64) time.Duration {
	return time.Duration(d - t.now())
}

func (t *table) hash(key []byte) uint32 { return uint32(maphash.Bytes(t.seed, key)) }

// find returns the slot of key, or -1.
func (t *table) find(key []byte) int {
	h := t.hash(key)
	mask := uint32(len(t.index) - 1)
	for p := h & mask; ; p = (p + 1) & mask {
		v := t.index[p]
		if v == 0 {
			return -1
		}
		r := &t.recs[v-1]
		if r.hash == h && bytes.Equal(t.arena[r.off:r.off+uint64(r.klen)], key) {
			return int(v - 1)
		}
	}
}

// key returns the key of slot i (aliasing the arena).
func (t *table) key(i int) []byte {
	r := &t.recs[i]
	return t.arena[r.off : r.off+uint64(r.klen)]
}

// value returns the value of slot i (aliasing the arena).
func (t *table) value(i int) []byte {
	r := &t.recs[i]
	start := r.off + uint64(r.klen)
	return t.arena[start : start+uint64(r.vlen) : start+uint64(r.vlen)]
}

// version returns the version of slot i.
func (t *table) version(i int) hlc.Timestamp {
	r := &t.recs[i]
	return hlc.Timestamp{Wall: r.wall, Counter: r.counter &^ fencedBit, Node: t.node}
}

// fence returns the fencing token of slot i; zero when it has none.
func (t *table) fence(i int) hlc.Timestamp {
	if t.recs[i].counter&fencedBit == 0 {
		return hlc.Timestamp{}
	}
	return t.fences[uint32(i)]
}

// raiseFence sets the fencing token of slot i to ft unless it has a later one.
func (t *table) raiseFence(i int, ft hlc.Timestamp) {
	if old := t.fence(i); !old.IsZero() && ft.Compare(old) <= 0 {
		return
	}
	t.fences[uint32(i)] = ft
	t.recs[i].counter |= fencedBit
}

// owner returns the user whose SET created slot i.
func (t *table) owner(i int) string { return t.owners[t.recs[i].owner&^persistedBit] }

// persisted reports whether slot i is on disk.
func (t *table) persisted(i int) bool { return t.recs[i].owner&persistedBit != 0 }

// setPersisted records whether slot i is on disk.
func (t *table) setPersisted(i int, on bool) {
	if on {
		t.recs[i].owner |= persistedBit
	} else {
		t.recs[i].owner &^= persistedBit
	}
}

// deadline returns the PX deadline of slot i; 0: none.
func (t *table) deadline(i int) int64 { return t.recs[i].deadline }

// size returns what slot i counts against its owner's MaxBytesPerUser.
func (t *table) size(i int) int64 { r := &t.recs[i]; return int64(r.klen) + int64(r.vlen) }

// usage returns what user's keys take.
func (t *table) usage(user string) usage { return t.users[user] }

// charge adds keys and bytes to user's usage.
func (t *table) charge(user string, keys int, bytes int64) {
	u := t.users[user]
	u.keys += keys
	u.bytes += bytes
	if u.keys == 0 && u.bytes == 0 {
		delete(t.users, user)
		return
	}
	t.users[user] = u
}

// ownerID interns user. Ids are never released: a store has few users.
func (t *table) ownerID(user string) uint32 {
	id, ok := t.ownerIDs[user]
	if !ok {
		id = uint32(len(t.owners))
		t.owners = append(t.owners, user)
		t.ownerIDs[user] = id
	}
	return id
}

// insert stores a new key (which must not be present) and returns its slot.
// deadline 0: no expiry.
func (t *table) insert(key, value []byte, owner string, version hlc.Timestamp, deadline int64) int {
	if (t.count+1)*4 > len(t.index)*3 {
		t.growIndex()
	}
	var i int
	if n := len(t.free); n > 0 {
		i = int(t.free[n-1])
		t.free = t.free[:n-1]
	} else {
		i = len(t.recs)
		t.recs = append(t.recs, record{})
	}
	off := uint64(len(t.arena))
	t.arena = append(append(t.arena, key...), value...)
	t.recs[i] = record{
		off:     off,
		klen:    uint32(len(key)),
		vlen:    uint32(len(value)),
		wall:    version.Wall,
		counter: version.Counter,
		owner:   t.ownerID(owner),
		heapIdx: -1,
		hash:    t.hash(key),
	}
	t.place(uint32(i))
	t.count++
	t.charge(owner, 1, int64(len(key)+len(value)))
	t.setDeadline(i, deadline)
	return i
}

// update gives slot i a new value and version, and deadline (0: no expiry).
// Its fencing token is kept.
func (t *table) update(i int, value []byte, version hlc.Timestamp, deadline int64) {
	r := &t.recs[i]
	old := int64(r.vlen)
	if len(value) <= int(r.vlen) {
		copy(t.arena[r.off+uint64(r.klen):], value)
		t.garbage += int(r.vlen) - len(value)
	} else {
		off := uint64(len(t.arena))
		t.arena = append(t.arena, t.arena[r.off:r.off+uint64(r.klen)]...)
		t.arena = append(t.arena, value...)
		t.garbage += int(r.klen) + int(r.vlen)
		r.off = off
	}
	r.vlen = uint32(len(value))
	r.wall = version.Wall
	r.counter = version.Counter | r.counter&fencedBit
	t.charge(t.owners[r.owner&^persistedBit], 0, int64(len(value))-old)
	t.setDeadline(i, deadline)
	t.maybeCompact()
}

// remove deletes slot i.
func (t *table) remove(i int) {
	r := &t.recs[i]
	if r.heapIdx >= 0 {
		t.heapRemove(int(r.heapIdx))
	}
	t.unplace(uint32(i))
	t.charge(t.owners[r.owner&^persistedBit], -1, -t.size(i))
	if r.counter&fencedBit != 0 {
		delete(t.fences, uint32(i))
	}
	t.garbage += int(r.klen) + int(r.vlen)
	*r = record{heapIdx: -1}
	t.free = append(t.free, uint32(i))
	t.count--
	t.removals++
	t.maybeCompact()
}

// place adds slot i, whose record is filled in, to the index.
func (t *table) place(i uint32) {
	mask := uint32(len(t.index) - 1)
	p := t.recs[i].hash & mask
	for t.index[p] != 0 {
		p = (p + 1) & mask
	}
	t.index[p] = i + 1
}

// unplace removes slot i from the index, shifting back the entries after it
// that would otherwise no longer be found (no tombstones).
func (t *table) unplace(i uint32) {
	mask := uint32(len(t.index) - 1)
	p := t.recs[i].hash & mask
	for t.index[p] != i+1 {
		p = (p + 1) & mask
	}
	t.index[p] = 0
	for q := (p + 1) & mask; t.index[q] != 0; q = (q + 1) & mask {
		home := t.recs[t.index[q]-1].hash & mask
		// The entry at q stays if its home is cyclically in (p, q].
		if p <= q && p < home && home <= q || p > q && (p < home || home <= q) {
			continue
		}
		t.index[p], t.index[q] = t.index[q], 0
		p = q
	}
}

// growIndex doubles the index.
func (t *table) growIndex() {
	old := t.index
	t.index = make([]uint32, 2*len(old))
	for _, v := range old {
		if v != 0 {
			t.place(v - 1)
		}
	}
}

// maybeCompact rewrites the arena with only the bytes of live records once
// garbage is more than half of it.
func (t *table) maybeCompact() {
	if len(t.arena) < compactMin || t.garbage*2 <= len(t.arena) {
		return
	}
	live := len(t.arena) - t.garbage
	arena := make([]byte, 0, live+live/8)
	for i := range t.recs {
		r := &t.recs[i]
		if r.klen == 0 {
			continue
		}
		n := uint64(r.klen) + uint64(r.vlen)
		off := uint64(len(arena))
		arena = append(arena, t.arena[r.off:r.off+n]...)
		r.off = off
	}
	t.arena = arena
	t.garbage = 0
}

// setDeadline sets the deadline of slot i (0: none) and its place in the
// expiry heap.
func (t *table) setDeadline(i int, deadline int64) {
	r := &t.recs[i]
	r.deadline = deadline
	switch {
	case deadline == 0 && r.heapIdx >= 0:
		t.heapRemove(int(r.heapIdx))
	case deadline != 0 && r.heapIdx >= 0:
		t.heapFix(int(r.heapIdx))
	case deadline != 0:
		r.heapIdx = int32(len(t.expiry))
		t.expiry = append(t.expiry, uint32(i))
		t.heapUp(len(t.expiry) - 1)
	}
}

// nextExpiry returns the earliest deadline; false when no key expires.
func (t *table) nextExpiry() (int64, bool) {
	if len(t.expiry) == 0 {
		return 0, false
	}
	return t.recs[t.expiry[0]].deadline, true
}

// expired returns the slot of a key whose deadline is not after now; -1
// when there is none.
func (t *table) expired(now int64) int {
	if len(t.expiry) == 0 || t.recs[t.expiry[0]].deadline > now {
		return -1
	}
	return int(t.expiry[0])
}

// popExpired removes the next key whose deadline is not after now and
// returns it; false when there is none.
func (t *table) popExpired(now int64) (string, bool) {
	if len(t.expiry) == 0 || t.recs[t.expiry[0]].deadline > now {
		return "", false
	}
	i := int(t.expiry[0])
	key := string(t.key(i))
	t.remove(i)
	return key, true
}

// The expiry heap orders slots by deadline, so the next expiry is found in
// O(1) and each insert, update or removal costs O(log n): expiry never scans
// the key space. Each record knows its place in it (heapIdx).

func (t *table) heapLess(a, b int) bool {
	return t.recs[t.expiry[a]].deadline < t.recs[t.expiry[b]].deadline
}

func (t *table) heapSwap(a, b int) {
	h := t.expiry
	h[a], h[b] = h[b], h[a]
	t.recs[h[a]].heapIdx = int32(a)
	t.recs[h[b]].heapIdx = int32(b)
}

func (t *table) heapUp(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !t.heapLess(j, p) {
			break
		}
		t.heapSwap(j, p)
		j = p
	}
}

func (t *table) heapDown(j int) bool {
	start, n := j, len(t.expiry)
	for {
		c := 2*j + 1
		if c >= n {
			break
		}
		if c+1 < n && t.heapLess(c+1, c) {
			c++
		}
		if !t.heapLess(c, j) {
			break
		}
		t.heapSwap(j, c)
		j = c
	}
	return j > start
}

func (t *table) heapFix(j int) {
	if !t.heapDown(j) {
		t.heapUp(j)
	}
}

func (t *table) heapRemove(j int) {
	n := len(t.expiry) - 1
	if j != n {
		t.heapSwap(j, n)
	}
	t.recs[t.expiry[n]].heapIdx = -1
	t.expiry = t.expiry[:n]
	if j != n {
		t.heapFix(j)
	}
}

// watch registers clientID's interest in key; it reports whether the watch is new.
func (t *table) watch(clientID string, key []byte) bool {
	k := string(key)
	w := t.watches[k]
	if w == nil {
		w = make(map[string]struct{})
		t.watches[k] = w
	}
	if _, ok := w[clientID]; ok {
		return false
	}
	w[clientID] = struct{}{}
	o := t.byOwner[clientID]
	if o == nil {
		o = make(map[string]struct{})
		t.byOwner[clientID] = o
	}
	o[k] = struct{}{}
	return true
}

// watchCount returns how many keys clientID watches.
func (t *table) watchCount(clientID string) int { return len(t.byOwner[clientID]) }

// watching reports whether clientID watches key.
func (t *table) watching(clientID string, key []byte) bool {
	_, ok := t.byOwner[clientID][string(key)]
	return ok
}

// unwatch removes clientID's watch of key; it reports whether there was one.
func (t *table) unwatch(clientID string, key string) bool {
	w := t.watches[key]
	if _, ok := w[clientID]; !ok {
		return false
	}
	delete(w, clientID)
	if len(w) == 0 {
		delete(t.watches, key)
	}
	o := t.byOwner[clientID]
	delete(o, key)
	if len(o) == 0 {
		delete(t.byOwner, clientID)
	}
	return true
}

// watchedBy returns the keys clientID watches.
func (t *table) watchedBy(clientID string) []string {
	o := t.byOwner[clientID]
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	return keys
}

// watchers returns the ids of the clients watching key (nil when none).
func (t *table) watchers(key []byte) map[string]struct{} {
	return t.watches[string(key)]
}
