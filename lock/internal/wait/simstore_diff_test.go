package wait

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// TestSimStoreMatchesLocalStore runs the same seeded random operations on
// the local store, over TCP, and on simStore, and compares what lock would
// see: whether each write applied, the class of each error, what GET
// reads, and the events a watching client receives (key, op, value,
// Resync, and the order of versions: the two clocks differ in value). It
// also cuts the watcher's connection with changes held back from it, and
// restarts the store, and compares the watcher's resync.
func TestSimStoreMatchesLocalStore(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			d := newSimDiff(t, seed)
			for i := range 160 {
				switch {
				case i == 80:
					d.restart()
				case i%40 == 20:
					d.reconnect()
				default:
					d.step()
				}
			}
			d.expire()
			d.finish()
		})
	}
}

// simConn is the watcher's connection number in the model.
const simConn = 1

// simDiff drives the local store and the model side by side.
type simDiff struct {
	t        *testing.T
	ctx      context.Context
	rng      *rand.Rand
	srv      *localstore.Server
	c        *sskv.Client // writes and reads
	wc       *sskv.Client // watches every key; simConn in the model
	m        *simStore
	keys     []string
	watchers map[string]*sskv.Watcher
	events   chan sskv.Event // every watcher's events, in the order the client delivers them
	// Versions seen, the model's with the store's: the tokens the
	// operations use, and the order both must agree on.
	vers    [][2]hlc.Timestamp
	toReal  map[hlc.Timestamp]hlc.Timestamp
	toModel map[hlc.Timestamp]hlc.Timestamp
	seen    map[string]int // outcomes compared, by kind: shows what a seed covered
}

var simValues = [][]byte{[]byte("a"), []byte("b"), []byte("c"), {}}

func newSimDiff(t *testing.T, seed uint64) *simDiff {
	srv := storetest.Start(t)
	d := &simDiff{
		t: t, ctx: storetest.Ctx(t), rng: rand.New(rand.NewPCG(seed, 0x5eed)),
		srv: srv, c: storetest.Dial(t, srv.Addr()), wc: storetest.Dial(t, srv.Addr()),
		m: newSimStore(), watchers: map[string]*sskv.Watcher{}, events: make(chan sskv.Event, 4096),
		toReal: map[hlc.Timestamp]hlc.Timestamp{}, toModel: map[hlc.Timestamp]hlc.Timestamp{},
		seen: map[string]int{},
	}
	for i := range 3 {
		d.keys = append(d.keys, fmt.Sprintf("%s-k%d", storetest.ID(t), i))
	}
	for _, k := range d.keys {
		d.watch(k)
	}
	return d
}

// watch starts watching key on both sides and compares the Initial events.
func (d *simDiff) watch(key string) {
	d.t.Helper()
	w, err := d.wc.Watch(d.ctx, key, sskv.WithCallback(func(ev sskv.Event) { d.events <- ev }, nil))
	if err != nil {
		d.t.Fatalf("Watch %s: %v", key, err)
	}
	d.watchers[key] = w
	want := d.m.watch(simConn, key)
	got := d.next()
	if !got.Initial {
		d.t.Fatalf("watch %s: first event %+v is not Initial", key, got)
	}
	d.compare("initial", want, got)
}

// next returns the next event the watcher's client delivers.
func (d *simDiff) next() sskv.Event {
	d.t.Helper()
	select {
	case ev := <-d.events:
		return ev
	case <-d.ctx.Done():
		d.t.Fatalf("no event: %v", d.ctx.Err())
		return sskv.Event{}
	}
}

// version records that model version mv is real version rv.
func (d *simDiff) version(what string, mv, rv hlc.Timestamp) {
	d.t.Helper()
	if mv.IsZero() != rv.IsZero() {
		d.t.Fatalf("%s: model version %v, store version %v", what, mv, rv)
	}
	if mv.IsZero() {
		return
	}
	r, okR := d.toReal[mv]
	m, okM := d.toModel[rv]
	if okR && r != rv || okM && m != mv {
		d.t.Fatalf("%s: model version %v is store version %v, but before it was %v (and %v was %v)", what, mv, rv, r, rv, m)
	}
	if !okR {
		d.toReal[mv], d.toModel[rv] = rv, mv
		d.vers = append(d.vers, [2]hlc.Timestamp{mv, rv})
	}
}

// compare checks that the store's event got is the model's note want.
func (d *simDiff) compare(what string, want simNote, got sskv.Event) {
	d.t.Helper()
	if got.Key != want.Key || got.Op != want.Op || !bytes.Equal(got.Value, want.Value) || got.Resync != want.Resync {
		d.t.Fatalf("%s: store delivered %s %s %q resync=%v, model %v", what, got.Key, got.Op, got.Value, got.Resync, want)
	}
	d.version(what+" "+want.String(), want.Version, got.Version)
}

// drain takes every note the model has for the watcher and compares each
// with the next event the store's client delivers.
func (d *simDiff) drain(what string) {
	d.t.Helper()
	for {
		want, ok := d.m.pop(simConn)
		if !ok {
			return
		}
		d.compare(what, want, d.next())
		d.seen[fmt.Sprintf("event %s resync=%v", want.Op, want.Resync)]++
	}
}

// token picks a fencing token: none, a recent version (often the fence),
// or any earlier one (often lower).
func (d *simDiff) token() (model, real hlc.Timestamp) {
	n := len(d.vers)
	switch r := d.rng.IntN(10); {
	case n == 0 || r < 3:
		return hlc.Timestamp{}, hlc.Timestamp{}
	case r < 8:
		v := d.vers[n-1-d.rng.IntN(min(n, 4))]
		return v[0], v[1]
	default:
		v := d.vers[d.rng.IntN(n)]
		return v[0], v[1]
	}
}

// errClass names the class of a write's error as lock tells them apart.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, sskv.ErrFencingTokenRequired):
		return "fencing-required"
	case errors.Is(err, sskv.ErrFencingTokenLower):
		return "fencing-lower"
	}
	return "other: " + err.Error()
}

// write runs one random SET, VDEL or DEL on both sides and compares the
// outcomes; the notes it makes are left to the caller.
func (d *simDiff) write() {
	d.t.Helper()
	key := d.keys[d.rng.IntN(len(d.keys))]
	value := simValues[d.rng.IntN(len(simValues))]
	mft, rft := d.token()
	var what, verb string
	var mok, rok bool
	var merr, rerr error
	switch op := d.rng.IntN(10); {
	case op < 6:
		cond := []sskv.Condition{sskv.Always, sskv.IfNotExists, sskv.IfEqualOrNotExists}[d.rng.IntN(3)]
		ttl := []time.Duration{0, time.Hour}[d.rng.IntN(2)]
		what, verb = fmt.Sprintf("SET %s %q %v ttl=%v ft=%v", key, value, cond, ttl, mft), "SET "+cond.String()
		var mv hlc.Timestamp
		mok, mv, merr = d.m.set(key, value, simSet{Cond: cond, TTL: ttl, FT: mft})
		res, err := d.c.Set(d.ctx, key, value, sskv.SetOptions{Condition: cond, Expiry: ttl, FencingToken: rft})
		rok, rerr = res.Applied, err
		if merr == nil && rerr == nil {
			d.version(what, mv, res.Version)
		}
	case op < 8:
		what, verb = fmt.Sprintf("VDEL %s %q ft=%v", key, value, mft), "VDEL"
		mok, merr = d.m.vdel(key, value, mft)
		res, err := d.c.VDel(d.ctx, key, value, sskv.DelOptions{FencingToken: rft})
		rok, rerr = res.Deleted, err
	default:
		what, verb = fmt.Sprintf("DEL %s ft=%v", key, mft), "DEL"
		mok, merr = d.m.delFT(key, mft)
		res, err := d.c.Del(d.ctx, key, sskv.DelOptions{FencingToken: rft})
		rok, rerr = res.Deleted, err
	}
	if mok != rok || errClass(merr) != errClass(rerr) {
		d.t.Fatalf("%s: store %v %s, model %v %s", what, rok, errClass(rerr), mok, errClass(merr))
	}
	d.seen[fmt.Sprintf("%s %v %s", verb, rok, errClass(rerr))]++
}

// step runs one random operation and compares what the watcher gets.
func (d *simDiff) step() {
	d.t.Helper()
	if d.rng.IntN(5) > 0 {
		d.write()
		d.drain("after a write")
		return
	}
	key := d.keys[d.rng.IntN(len(d.keys))]
	mv, mver, mfound := d.m.get(key)
	g, err := d.c.Get(d.ctx, key)
	if err != nil {
		d.t.Fatalf("GET %s: %v", key, err)
	}
	if g.Found != mfound || !bytes.Equal(g.Value, mv) {
		d.t.Fatalf("GET %s: store %v %q, model %v %q", key, g.Found, g.Value, mfound, mv)
	}
	d.version("GET "+key, mver, g.Version)
}

// reconnect holds back what the store sends the watcher during a few
// writes, then ends its connection and its session (a connection of the
// same client id with a clean start takes them over, and leaves): those
// notifications are lost, and the client resyncs when it reconnects. (A
// connection merely cut would resume its session, and the broker would
// send again what it had not had acknowledged: see the model's reconnect.)
func (d *simDiff) reconnect() {
	d.t.Helper()
	id := d.wc.ID()
	if err := d.srv.Hold(id, localstore.FromStore); err != nil {
		d.t.Fatal(err)
	}
	for range 1 + d.rng.IntN(4) {
		d.write()
	}
	imp, err := sskv.Dial(d.ctx, sskv.Config{Addr: d.srv.Addr(), ClientID: id, CleanStart: true})
	if err != nil {
		d.t.Fatalf("taking over the watcher's session: %v", err)
	}
	_ = imp.Close()
	d.m.reconnect(simConn)
	d.resynced("after a reconnect")
}

// restart restarts the store; neither side keeps a key.
func (d *simDiff) restart() {
	d.t.Helper()
	next, err := d.srv.Restart(d.ctx, 0)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { _ = next.Close() })
	d.srv = next
	d.m.restart()
	d.resynced("after a restart")
}

// resynced compares the Resync events of the watcher's reconnect. The client
// resyncs its keys concurrently: their order is not compared. A key that
// gets no Resync gives no sign that its resync has ended, and a
// notification that came in before it had would turn into a Resync: so
// such a key is watched again (a new watch of a key waits for the resync of
// the one stopped), which also checks that nothing came for it.
func (d *simDiff) resynced(what string) {
	d.t.Helper()
	storetest.Eventually(d.t, "the watches registered again", func() bool {
		for _, k := range d.keys {
			if !d.srv.Watching(d.wc.ID(), k) {
				return false
			}
		}
		return true
	})
	var want []simNote
	for {
		n, ok := d.m.pop(simConn)
		if !ok {
			break
		}
		want = append(want, n)
	}
	var got []sskv.Event
	for range want {
		got = append(got, d.next())
	}
	slices.SortFunc(got, func(a, b sskv.Event) int { return strings.Compare(a.Key, b.Key) })
	for i := range want {
		d.compare(what, want[i], got[i])
		d.seen[fmt.Sprintf("event %s resync=%v", want[i].Op, want[i].Resync)]++
	}
	for _, k := range d.keys {
		if slices.ContainsFunc(want, func(n simNote) bool { return n.Key == k }) {
			continue
		}
		d.watchers[k].Stop()
		d.m.unwatch(simConn, k)
		d.watch(k)
		d.seen["no resync"]++
	}
}

// newest returns the newest version seen, model's and store's: a token at
// least as new as every fence.
func (d *simDiff) newest() (model, real hlc.Timestamp) {
	v := d.vers[len(d.vers)-1]
	return v[0], v[1]
}

// expire sets a key with a short TTL and waits for the store to expire it,
// while the model's clock is moved past the deadline.
func (d *simDiff) expire() {
	d.t.Helper()
	const ttl = 30 * time.Millisecond
	k := d.keys[0]
	mft, rft := d.newest()
	ok, mv, err := d.m.set(k, []byte("ttl"), simSet{TTL: ttl, FT: mft})
	res, rerr := d.c.Set(d.ctx, k, []byte("ttl"), sskv.SetOptions{Expiry: ttl, FencingToken: rft})
	if !ok || err != nil || !res.Applied || rerr != nil {
		d.t.Fatalf("SET %s with a TTL: store %v %v, model %v %v", k, res.Applied, rerr, ok, err)
	}
	d.version("SET with a TTL", mv, res.Version)
	d.drain("a SET with a TTL")
	if at, ok := d.m.nextExpiry(); !ok || at != d.m.now()+ttl {
		d.t.Fatalf("model: next expiry %v %v, want %v", at, ok, d.m.now()+ttl)
	}
	d.m.advance(d.m.now() + ttl)
	d.drain("an expiry") // the store's DELETE comes when its expiry loop runs
	if g, err := d.c.Get(d.ctx, k); err != nil || g.Found {
		d.t.Fatalf("GET %s after its expiry: %+v %v", k, g, err)
	}
	if _, _, found := d.m.get(k); found {
		d.t.Fatalf("model: %s found after its expiry", k)
	}
}

// finish writes every key once more, so that an event the store's client
// delivered and the model did not shows before the last, checks that
// nothing is left, and that both sides ordered every version alike.
func (d *simDiff) finish() {
	d.t.Helper()
	for _, k := range d.keys {
		mft, rft := d.newest()
		ok, mv, err := d.m.set(k, []byte("end"), simSet{FT: mft})
		res, rerr := d.c.Set(d.ctx, k, []byte("end"), sskv.SetOptions{FencingToken: rft})
		if !ok || err != nil || !res.Applied || rerr != nil {
			d.t.Fatalf("last SET %s: store %v %v, model %v %v", k, res.Applied, rerr, ok, err)
		}
		d.version("last SET "+k, mv, res.Version)
		d.drain("at the end")
	}
	select {
	case ev := <-d.events:
		d.t.Fatalf("an event the model did not make: %+v", ev)
	default:
	}
	slices.SortFunc(d.vers, func(a, b [2]hlc.Timestamp) int { return a[0].Compare(b[0]) })
	for i := 1; i < len(d.vers); i++ {
		if !d.vers[i][1].After(d.vers[i-1][1]) {
			d.t.Fatalf("versions ordered differently: model %v < %v, store %v >= %v",
				d.vers[i-1][0], d.vers[i][0], d.vers[i-1][1], d.vers[i][1])
		}
	}
	d.t.Logf("%d versions compared; outcomes: %v", len(d.vers), d.seen)
}

// popAll takes every note waiting for conn.
func popAll(s *simStore, conn int) []simNote {
	var ns []simNote
	for {
		n, ok := s.pop(conn)
		if !ok {
			return ns
		}
		ns = append(ns, n)
	}
}

// Keys expire at their deadline, in deadline order, each deletion notified
// with the time it happened; a SET replaces the expiry, and the fence goes
// with the key.
func TestSimStoreExpiry(t *testing.T) {
	s := newSimStore()
	s.watch(1, "a")
	s.watch(1, "b")
	s.advance(10 * time.Millisecond)
	if _, v, err := s.set("a", []byte("1"), simSet{TTL: 100 * time.Millisecond, FT: hlc.Timestamp{Wall: 1, Node: "x"}}); err != nil || v.Wall != simWallBase+10 {
		t.Fatalf("SET a: %v %v", v, err)
	}
	s.set("b", []byte("2"), simSet{TTL: 50 * time.Millisecond})
	set := popAll(s, 1)
	if at, ok := s.nextExpiry(); !ok || at != 60*time.Millisecond {
		t.Fatalf("next expiry %v %v, want 60ms", at, ok)
	}
	s.advance(59 * time.Millisecond)
	s.advance(20 * time.Millisecond) // never backwards
	if s.now() != 59*time.Millisecond || s.pending(1) != 0 {
		t.Fatalf("at %v, %d notes before any deadline", s.now(), s.pending(1))
	}
	// A NEX renewal moves a's deadline on; b expires at its own.
	if ok, _, _ := s.set("a", []byte("1"), simSet{Cond: sskv.IfEqualOrNotExists, TTL: 100 * time.Millisecond, FT: hlc.Timestamp{Wall: 1, Node: "x"}}); !ok {
		t.Fatal("NEX renewal not applied")
	}
	renew, _ := s.pop(1)
	s.advance(time.Second)
	got := popAll(s, 1)
	if len(got) != 2 || got[0].Key != "b" || got[1].Key != "a" || got[0].Op != sskv.OpDelete || got[1].Op != sskv.OpDelete ||
		got[0].Version.Wall != simWallBase+60 || got[1].Version.Wall != simWallBase+159 ||
		!got[0].Version.After(renew.Version) || !renew.Version.After(set[1].Version) {
		t.Fatalf("expiry notes %v after %v, %v", got, set, renew)
	}
	if _, _, found := s.get("a"); found || s.now() != time.Second {
		t.Fatalf("a found after its expiry, or now %v", s.now())
	}
	if _, ok := s.nextExpiry(); ok {
		t.Fatal("an expiry left with no key")
	}
	if ok, _, err := s.set("a", []byte("3"), simSet{}); !ok || err != nil {
		t.Fatalf("SET of an expired fenced key without a token: %v %v", ok, err)
	}
	s.set("a", []byte("3"), simSet{TTL: time.Millisecond})
	s.set("a", []byte("3"), simSet{}) // no TTL: no expiry
	if _, ok := s.nextExpiry(); ok {
		t.Fatal("a SET without a TTL kept the expiry")
	}
	if _, _, err := s.set("a", nil, simSet{TTL: time.Microsecond}); !errors.Is(err, sskv.ErrInvalidOption) {
		t.Fatalf("TTL below 1ms: %v", err)
	}
}

// After a reconnect, a watcher gets a Resync with the key's state if it
// differs from what it was last given, and nothing otherwise.
func TestSimStoreReconnect(t *testing.T) {
	s := newSimStore()
	if n := s.watch(1, "k"); n.Op != sskv.OpDelete || !n.Version.IsZero() {
		t.Fatalf("initial of a missing key: %v", n)
	}
	_, v1, _ := s.set("k", []byte("1"), simSet{})
	s.reconnect(1) // the SET's note is lost
	if got := popAll(s, 1); len(got) != 1 || !got[0].Resync || got[0].Op != sskv.OpSet || got[0].Version != v1 {
		t.Fatalf("after a missed SET: %v", got)
	}
	s.set("k", []byte("2"), simSet{})
	_, v3, _ := s.set("k", []byte("3"), simSet{})
	s.pop(1)
	s.reconnect(1)
	if got := popAll(s, 1); len(got) != 1 || !got[0].Resync || string(got[0].Value) != "3" || got[0].Version != v3 {
		t.Fatalf("after a missed second SET: %v", got)
	}
	s.del("k")
	s.set("k", []byte("4"), simSet{})
	s.vdel("k", []byte("4"), hlc.Timestamp{})
	s.reconnect(1)
	s.reconnect(1) // twice: the same Resync, once
	if got := popAll(s, 1); len(got) != 1 || !got[0].Resync || got[0].Op != sskv.OpDelete || !got[0].Version.IsZero() {
		t.Fatalf("after a missed delete: %v", got)
	}
	s.set("k", []byte("5"), simSet{})
	s.del("k")
	s.reconnect(1) // missing, as last told: nothing
	if n := s.pending(1); n != 0 {
		t.Fatalf("%d notes for a key whose state was already told", n)
	}
	s.set("k", []byte("6"), simSet{})
	s.unwatch(1, "k")
	if n := s.pending(1); n != 0 {
		t.Fatalf("%d notes left for a key no longer watched", n)
	}
}

// A restart loses every key and fence without a notification; watchers
// told of a key get a Resync of its deletion; versions keep increasing.
func TestSimStoreRestart(t *testing.T) {
	s := newSimStore()
	s.watch(1, "a")
	s.watch(1, "b")
	s.watch(2, "b")
	s.watch(2, "c")
	_, fence, _ := s.set("a", []byte("1"), simSet{})
	s.set("a", []byte("1"), simSet{FT: fence})
	_, last, _ := s.set("b", []byte("2"), simSet{TTL: time.Second})
	if s.del("a") {
		t.Fatal("DEL without a token deleted a fenced key")
	}
	if ok, err := s.delFT("a", hlc.Timestamp{Wall: 1, Node: "x"}); ok || !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("DEL with a lower token: %v %v", ok, err)
	}
	popAll(s, 1)
	s.pop(2) // conn 2 was told of b, conn 1 of both
	s.restart()
	got1, got2 := popAll(s, 1), popAll(s, 2)
	if len(got1) != 2 || got1[0].Key != "a" || got1[1].Key != "b" || len(got2) != 1 || got2[0].Key != "b" {
		t.Fatalf("after a restart: conn 1 %v, conn 2 %v", got1, got2)
	}
	for _, n := range append(got1, got2...) {
		if !n.Resync || n.Op != sskv.OpDelete || !n.Version.IsZero() {
			t.Fatalf("after a restart: %v", n)
		}
	}
	if _, ok := s.nextExpiry(); ok {
		t.Fatal("an expiry survived the restart")
	}
	ok, v, err := s.set("a", []byte("3"), simSet{})
	if !ok || err != nil || !v.After(last) {
		t.Fatalf("SET after a restart, of a key fenced before: %v %v %v (last version %v)", ok, v, err, last)
	}
}
