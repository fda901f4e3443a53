package localstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/dsslock/dsslock/hlc"
)

// TestRecordIsSmallAndPointerFree: the slab's records stay 48 bytes; the GC
// never scans them as long as they hold no pointers (a compile-time property
// this test cannot check, so keep record's fields numbers).
func TestRecordIsSmallAndPointerFree(t *testing.T) {
	if n := unsafe.Sizeof(record{}); n != 48 {
		t.Fatalf("record is %d bytes, want 48", n)
	}
}

// checkTable verifies the table's invariants: every live slot is in the
// index once and found by its key, the heap is ordered and each record
// knows its place, counts and garbage add up.
func checkTable(t *testing.T, tab *table) {
	t.Helper()
	live, liveBytes := 0, 0
	for i := range tab.recs {
		r := &tab.recs[i]
		if r.klen == 0 {
			continue
		}
		live++
		liveBytes += int(r.klen) + int(r.vlen)
		if got := tab.find(tab.key(i)); got != i {
			t.Fatalf("slot %d (key %q) found at %d", i, tab.key(i), got)
		}
		if (r.deadline != 0) != (r.heapIdx >= 0) {
			t.Fatalf("slot %d: deadline %d, heap index %d", i, r.deadline, r.heapIdx)
		}
		if r.heapIdx >= 0 && tab.expiry[r.heapIdx] != uint32(i) {
			t.Fatalf("slot %d: heap index %d holds %d", i, r.heapIdx, tab.expiry[r.heapIdx])
		}
	}
	if live != tab.count {
		t.Fatalf("%d live slots, count %d", live, tab.count)
	}
	inIndex := 0
	for _, v := range tab.index {
		if v != 0 {
			inIndex++
		}
	}
	if inIndex != live {
		t.Fatalf("%d index entries, %d live slots", inIndex, live)
	}
	if liveBytes+tab.garbage != len(tab.arena) {
		t.Fatalf("%d live bytes + %d garbage != arena %d", liveBytes, tab.garbage, len(tab.arena))
	}
	if len(tab.arena) >= compactMin && tab.garbage*2 > len(tab.arena) {
		t.Fatalf("arena of %d bytes, %d garbage: not compacted", len(tab.arena), tab.garbage)
	}
	for j := 1; j < len(tab.expiry); j++ {
		if tab.heapLess(j, (j-1)/2) {
			t.Fatalf("heap out of order at %d", j)
		}
	}
}

func ts(wall int64, counter uint32) hlc.Timestamp {
	return hlc.Timestamp{Wall: wall, Counter: counter, Node: "n"}
}

func TestTableInsertFindRemove(t *testing.T) {
	tab := newTable("n")
	i := tab.insert([]byte("k"), []byte("v"), "alice", ts(5, 7), 0)
	if tab.find([]byte("k")) != i || tab.find([]byte("x")) != -1 {
		t.Fatal("find")
	}
	if string(tab.value(i)) != "v" || tab.version(i) != ts(5, 7) || tab.owner(i) != "alice" || !tab.fence(i).IsZero() {
		t.Fatalf("record %q %v %q %v", tab.value(i), tab.version(i), tab.owner(i), tab.fence(i))
	}
	if u := tab.usage("alice"); u.keys != 1 || u.bytes != 2 {
		t.Fatalf("usage %+v", u)
	}
	tab.raiseFence(i, hlc.Timestamp{Wall: 9, Node: "client"})
	tab.raiseFence(i, hlc.Timestamp{Wall: 3, Node: "client"}) // lower: kept
	tab.update(i, []byte("longer value"), ts(6, 0), 0)
	if f := tab.fence(i); f.Wall != 9 || f.Node != "client" || tab.version(i) != ts(6, 0) || string(tab.value(i)) != "longer value" {
		t.Fatalf("after update: fence %v version %v value %q", f, tab.version(i), tab.value(i))
	}
	checkTable(t, tab)
	tab.remove(i)
	if tab.find([]byte("k")) != -1 || tab.len() != 0 || len(tab.fences) != 0 || len(tab.users) != 0 {
		t.Fatal("not removed")
	}
	j := tab.insert([]byte("k2"), []byte("v"), "bob", ts(7, 0), 0)
	if j != i || !tab.fence(j).IsZero() {
		t.Fatalf("free slot %d not reused (got %d) or fence %v kept", i, j, tab.fence(j))
	}
	checkTable(t, tab)
}

// TestTableGrowAndCollide fills the index through several doublings with
// keys that all collide on the low bits, and removes them in an order that
// exercises backward-shift deletion across the wrap-around.
func TestTableGrowAndCollide(t *testing.T) {
	tab := newTable("n")
	const n = 5000
	var keys [][]byte
	for i := 0; len(keys) < n; i++ {
		k := fmt.Appendf(nil, "key-%d", i)
		if tab.hash(k)&7 == 3 { // the same home slot in an index of 8..
			keys = append(keys, k)
		}
		if len(keys) < n/2 && i%7 == 0 { // ..and some that are not
			keys = append(keys, fmt.Appendf(nil, "other-%d", i))
		}
	}
	for i, k := range keys {
		tab.insert(k, fmt.Appendf(nil, "v%d", i), "", ts(1, 0), 0)
	}
	if len(tab.index)*3 < len(keys)*4 {
		t.Fatalf("index of %d for %d keys", len(tab.index), len(keys))
	}
	checkTable(t, tab)
	for i := 0; i < len(keys); i += 2 {
		tab.remove(tab.find(keys[i]))
	}
	checkTable(t, tab)
	for i, k := range keys {
		got := tab.find(k)
		if (i%2 == 0) != (got < 0) {
			t.Fatalf("key %q: slot %d", k, got)
		}
		if got >= 0 && string(tab.value(got)) != fmt.Sprintf("v%d", i) {
			t.Fatalf("key %q: value %q", k, tab.value(got))
		}
	}
}

// TestTableUnplaceWraps removes an entry just before the end of the index
// whose displaced neighbours wrapped to its start.
func TestTableUnplaceWraps(t *testing.T) {
	tab := newTable("n")
	var keys [][]byte
	for i := 0; len(keys) < 4; i++ {
		k := fmt.Appendf(nil, "w%d", i)
		if tab.hash(k)&15 == 14 {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		tab.insert(k, nil, "", ts(1, 0), 0) // slots 14, 15, 0, 1
	}
	tab.remove(tab.find(keys[0]))
	tab.remove(tab.find(keys[2]))
	checkTable(t, tab)
	if tab.find(keys[1]) < 0 || tab.find(keys[3]) < 0 {
		t.Fatal("lost a key")
	}
}

// TestTableCompacts: rewriting values makes garbage; once it is more than
// half the arena, the arena is rewritten with only live bytes (checkTable
// checks that after every round).
func TestTableCompacts(t *testing.T) {
	tab := newTable("n")
	big := bytes.Repeat([]byte("x"), 1000)
	var slots []int
	for i := range 2000 {
		slots = append(slots, tab.insert(fmt.Appendf(nil, "k%d", i), big[:10], "", ts(1, 0), 0))
	}
	for round := range 6 {
		for _, i := range slots {
			tab.update(i, big[:100*(round+1)], ts(2, 0), 0)
		}
		checkTable(t, tab)
	}
	if len(tab.arena) < compactMin {
		t.Fatalf("arena of %d bytes: too small to test compaction", len(tab.arena))
	}
	for k, i := range slots {
		if !bytes.Equal(tab.value(i), big[:600]) || string(tab.key(i)) != fmt.Sprintf("k%d", k) {
			t.Fatalf("slot %d: %q = %d bytes", i, tab.key(i), len(tab.value(i)))
		}
	}
}

// TestTableExpiryHeap pops keys in deadline order, with updates that move,
// add and clear deadlines.
func TestTableExpiryHeap(t *testing.T) {
	tab := newTable("n")
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		tab.insert(fmt.Appendf(nil, "k%d", i), nil, "", ts(1, 0), 1+r.Int64N(1000))
	}
	for i := range 500 {
		switch i % 3 {
		case 0:
			tab.update(i, []byte("v"), ts(2, 0), 0)
		case 1:
			tab.update(i, []byte("v"), ts(2, 0), 1+r.Int64N(1000))
		}
	}
	checkTable(t, tab)
	last := int64(0)
	n := 0
	for {
		d, ok := tab.nextExpiry()
		if !ok {
			break
		}
		if d < last {
			t.Fatalf("deadline %d after %d", d, last)
		}
		last = d
		if _, ok := tab.popExpired(d); !ok {
			t.Fatal("nothing popped at the next deadline")
		}
		n++
	}
	if want := 500 - 167; n != want || tab.len() != 167 {
		t.Fatalf("popped %d, want %d; %d left", n, want, tab.len())
	}
	checkTable(t, tab)
}

// TestTableMatchesMap runs random operations on a table and on a plain map
// and checks that they agree.
func TestTableMatchesMap(t *testing.T) {
	type want struct {
		value    string
		version  hlc.Timestamp
		fence    hlc.Timestamp
		owner    string
		deadline int64
	}
	tab := newTable("n")
	m := map[string]want{}
	r := rand.New(rand.NewPCG(3, 4))
	owners := []string{"", "alice", "bob"}
	for op := range 200_000 {
		k := fmt.Sprintf("key-%d", r.IntN(3000))
		i := tab.find([]byte(k))
		w, ok := m[k]
		if ok != (i >= 0) {
			t.Fatalf("op %d: key %q in map %v, slot %d", op, k, ok, i)
		}
		if ok {
			got := want{string(tab.value(i)), tab.version(i), tab.fence(i), tab.owner(i), tab.deadline(i)}
			if got != w {
				t.Fatalf("op %d: key %q is %+v, want %+v", op, k, got, w)
			}
		}
		v := ts(int64(op), uint32(r.IntN(1<<31)))
		val := string(bytes.Repeat([]byte{byte('a' + r.IntN(26))}, r.IntN(64)))
		var deadline int64
		if r.IntN(4) == 0 {
			deadline = 1 + r.Int64N(1<<40)
		}
		switch c := r.IntN(10); {
		case c < 5: // SET
			if ok {
				tab.update(i, []byte(val), v, deadline)
				w.value, w.version, w.deadline = val, v, deadline
			} else {
				owner := owners[r.IntN(len(owners))]
				i = tab.insert([]byte(k), []byte(val), owner, v, deadline)
				w = want{value: val, version: v, owner: owner, deadline: deadline}
			}
			if r.IntN(3) == 0 {
				ft := hlc.Timestamp{Wall: r.Int64N(100), Node: "c"}
				tab.raiseFence(i, ft)
				if w.fence.IsZero() || ft.Compare(w.fence) > 0 {
					w.fence = ft
				}
			}
			m[k] = w
		case c < 8: // DEL
			if ok {
				tab.remove(i)
				delete(m, k)
			}
		default: // expire the earliest
			if d, ok := tab.nextExpiry(); ok {
				key, _ := tab.popExpired(d)
				if m[key].deadline != d {
					t.Fatalf("op %d: popped %q with deadline %d, want %d", op, key, m[key].deadline, d)
				}
				delete(m, key)
			}
		}
		if op%20_000 == 0 {
			checkTable(t, tab)
		}
	}
	checkTable(t, tab)
	if tab.len() != len(m) {
		t.Fatalf("%d keys, map has %d", tab.len(), len(m))
	}
	usage := map[string]usage{}
	for k, w := range m {
		u := usage[w.owner]
		u.keys++
		u.bytes += int64(len(k) + len(w.value))
		usage[w.owner] = u
	}
	for _, o := range owners {
		if tab.usage(o) != usage[o] {
			t.Fatalf("usage of %q: %+v, want %+v", o, tab.usage(o), usage[o])
		}
	}
}
