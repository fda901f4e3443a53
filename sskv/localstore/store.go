package localstore

import (
	"bytes"
	"container/heap"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// entry is one stored key.
type entry struct {
	key     string
	value   []byte
	version hlc.Timestamp
	fence   hlc.Timestamp // zero: the key is not fenced
	expires time.Time     // zero: no expiry; monotonic reading otherwise
	index   int           // position in the expiry heap, -1 when not in it
	owner   string        // the user whose SET created the key: it counts against that user's quota
}

// size is what e counts against its owner's MaxBytesPerUser.
func (e *entry) size() int64 { return int64(len(e.key) + len(e.value)) }

// usage is what one user's keys take (see Config.MaxKeysPerUser).
type usage struct {
	keys  int
	bytes int64
}

// expiryHeap orders keys with an expiry by their deadline, so the next expiry
// is found in O(1) and each insert, update or removal costs O(log n): expiry
// never scans the key space.
type expiryHeap []*entry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires.Before(h[j].expires) }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *expiryHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.index = -1
	*h = old[:n-1]
	return e
}

// table is the key space with its expiry index and key watches. It is not
// safe for concurrent use: the Server guards it with its mutex.
type table struct {
	keys    map[string]*entry
	expiry  expiryHeap
	watches map[string]map[string]struct{} // key -> client ids
	byOwner map[string]map[string]struct{} // client id -> keys
	users   map[string]usage               // user -> its keys; no entry for a user without keys
}

func newTable() *table {
	return &table{
		keys:    make(map[string]*entry),
		watches: make(map[string]map[string]struct{}),
		byOwner: make(map[string]map[string]struct{}),
		users:   make(map[string]usage),
	}
}

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

// get returns the live entry for key, or nil.
func (t *table) get(key []byte) *entry {
	return t.keys[string(key)]
}

// put inserts e (isNew: a new key, owned by e.owner) or records that its
// value changed from one of oldSize bytes (key included). expires zero
// removes any expiry.
func (t *table) put(e *entry, isNew bool, oldSize int64, expires time.Time) {
	if isNew {
		e.index = -1
		t.keys[e.key] = e
		t.charge(e.owner, 1, e.size())
	} else {
		t.charge(e.owner, 0, e.size()-oldSize)
	}
	switch {
	case expires.IsZero() && e.index >= 0:
		heap.Remove(&t.expiry, e.index)
		e.expires = time.Time{}
	case !expires.IsZero():
		e.expires = expires
		if e.index >= 0 {
			heap.Fix(&t.expiry, e.index)
		} else {
			heap.Push(&t.expiry, e)
		}
	}
}

// remove deletes e from the key space.
func (t *table) remove(e *entry) {
	if e.index >= 0 {
		heap.Remove(&t.expiry, e.index)
	}
	delete(t.keys, e.key)
	t.charge(e.owner, -1, -e.size())
}

// nextExpiry returns the earliest deadline, or zero when no key expires.
func (t *table) nextExpiry() time.Time {
	if len(t.expiry) == 0 {
		return time.Time{}
	}
	return t.expiry[0].expires
}

// popExpired removes and returns the next entry whose deadline is not after
// now, or nil.
func (t *table) popExpired(now time.Time) *entry {
	if len(t.expiry) == 0 || t.expiry[0].expires.After(now) {
		return nil
	}
	e := heap.Pop(&t.expiry).(*entry)
	delete(t.keys, e.key)
	t.charge(e.owner, -1, -e.size())
	return e
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
func (t *table) watchers(key string) map[string]struct{} {
	return t.watches[key]
}

func sameValue(a, b []byte) bool { return bytes.Equal(a, b) }
