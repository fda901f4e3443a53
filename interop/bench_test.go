package interop

// Benchmarks of dsslock's lock package beside the official SDK's leasedlock,
// in pairs of sub-benchmarks (BenchmarkX/dsslock and BenchmarkX/sdk) that run
// in the same process against the same state store: the one TestMain starts
// (or DSSLOCK_STATESTORE_ADDR names). Both sides use one MQTT connection per
// client, plain TCP, no logging. What is measured, and why each pair is a fair
// comparison, is written above each benchmark; the numbers are in
// /work/notes/issue7-bench.md. Run them with
//
//	go test -run '^$' -bench . -benchmem -benchtime=200x

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// benchTimeout bounds one invocation of a benchmark function (all its
// iterations) and every call it makes.
const benchTimeout = 5 * time.Minute

func newBenchEnv(b *testing.B) *env {
	b.Helper()
	e := newEnvTimeout(b, benchTimeout)
	e.quiet = true
	return e
}

// ourClient connects a dsslock client (sskv) to the store under test, with
// the same defaults an application gets, and no log.
func (e *env) ourClient(name string) *sskv.Client {
	e.t.Helper()
	c, err := sskv.Dial(e.ctx, sskv.Config{
		Addr:     storeAddress(),
		ClientID: fmt.Sprintf("dsslock-%s-%s", name, randHex(4)),
	})
	if err != nil {
		e.t.Fatalf("sskv.Dial: %v", err)
	}
	e.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *env) ourLock(c *sskv.Client, cfg lock.Config) *lock.Lock {
	e.t.Helper()
	l, err := lock.New(c, cfg)
	if err != nil {
		e.t.Fatalf("lock.New: %v", err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// reportPercentiles reports the p50 and p99 of ds, in milliseconds (as
// lock/bench_test.go does).
func reportPercentiles(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-"+unit)
	b.ReportMetric(at(0.99), "p99-"+unit)
}

// ---- the spy: what the store answers a client ----

// spy is a third MQTT connection to the store that subscribes (QoS 0) to
// the response topics of chosen clients, "clients/<seg>/#": both clients put
// their response topics there, sskv with seg the client id, the SDK with seg
// the client id in upper-case hex (see respSegment). Notifications are under
// "clients/statestore/...", which this never matches. The store answers
// every request it executes with one PUBLISH to the requester's response
// topic, and the broker sends a copy of it to the spy: so the spy sees,
// without any hook in either client, every request a client made and what
// the store answered. It is subscribed only while it is needed, never while
// a timed handover runs.
type spy struct {
	c *paho.Client

	mu   sync.Mutex
	subs map[string]sink // by response topic segment

	// syncTopic is the spy's own topic, which it subscribes to: sync
	// publishes a mark there and waits for it (synced).
	syncTopic string
	synced    chan struct{}
}

// sink gets the payload of each response the spy sees for one client.
type sink interface{ add(payload []byte) }

// respSegment is the second level of the SDK client's response topic,
// "clients/<upper-case hex of the client id>/statestore/.../response".
func (c *client) respSegment() string {
	return strings.ToUpper(hex.EncodeToString([]byte(c.id)))
}

// tally is what the spy saw of one client's responses since follow.
type tally struct {
	mu     sync.Mutex
	n      int  // responses (= requests the store executed)
	sawOK  bool // a "+OK" (e.g. KEYNOTIFY's) was seen
	atPark int  // n when parked closed
	parkAt time.Time
	parked chan struct{} // closed at the first response after the first "+OK": the waiter sleeps on its watch
	seen   []string      // the first responses, abridged, for a failure message
}

var respOK = []byte("+OK\r\n")

func (t *tally) add(payload []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	if len(t.seen) < 16 {
		t.seen = append(t.seen, fmt.Sprintf("%.12q", payload))
	}
	switch {
	case t.sawOK:
		// The first response after the watch's: the SDK's SET that
		// finds the key held, dsslock's read that starts the watch.
		select {
		case <-t.parked:
		default:
			t.atPark, t.parkAt = t.n, time.Now()
			close(t.parked)
		}
	case bytes.Equal(payload, respOK):
		t.sawOK = true
	}
}

func (t *tally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return fmt.Sprintf("%d responses: %s", t.n, strings.Join(t.seen, " "))
}

// entry returns the responses up to the parking, and when it was seen.
func (t *tally) entry() (int, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.atPark, t.parkAt
}

func (e *env) newSpy() *spy {
	e.t.Helper()
	conn, err := (&net.Dialer{}).DialContext(e.ctx, "tcp", storeAddress())
	if err != nil {
		e.t.Fatalf("spy: %v", err)
	}
	id := "spy-" + randHex(4)
	s := &spy{subs: make(map[string]sink), syncTopic: "bench/" + id + "/sync", synced: make(chan struct{}, 1)}
	s.c = paho.NewClient(paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			s.seen(pr.Packet)
			return true, nil
		}},
	})
	if _, err := s.c.Connect(e.ctx, &paho.Connect{ClientID: id, KeepAlive: 60, CleanStart: true}); err != nil {
		e.t.Fatalf("spy: connect: %v", err)
	}
	if _, err := s.c.Subscribe(e.ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: s.syncTopic, QoS: 0}}}); err != nil {
		e.t.Fatalf("spy: subscribe: %v", err)
	}
	e.t.Cleanup(func() {
		_ = s.c.Disconnect(&paho.Disconnect{})
		<-s.c.Done()
	})
	return s
}

func (s *spy) seen(p *paho.Publish) {
	if p.Topic == s.syncTopic {
		select {
		case s.synced <- struct{}{}:
		default:
		}
		return
	}
	rest, ok := strings.CutPrefix(p.Topic, "clients/")
	if !ok {
		return
	}
	id, _, _ := strings.Cut(rest, "/")
	s.mu.Lock()
	t := s.subs[id]
	s.mu.Unlock()
	if t != nil {
		t.add(p.Payload)
	}
}

// follow subscribes to the responses of the client whose response topics
// start with "clients/<id>/" and returns a fresh tally
// of them. Once the SUBACK is back, every response the store publishes to id
// reaches the tally; none from before reaches it (the previous tally of id,
// if any, is dropped).
func (s *spy) follow(ctx context.Context, id string) (*tally, error) {
	t := &tally{parked: make(chan struct{})}
	if err := s.subscribe(ctx, map[string]sink{id: t}); err != nil {
		return nil, err
	}
	return t, nil
}

// subscribe is follow for several clients at once, in one SUBSCRIBE: each
// response to the client whose topics start with "clients/<id>/" goes to
// sinks[id].
func (s *spy) subscribe(ctx context.Context, sinks map[string]sink) error {
	subs := make([]paho.SubscribeOptions, 0, len(sinks))
	for id := range sinks {
		if id == "statestore" || strings.ContainsAny(id, "/+#") {
			return fmt.Errorf("spy: cannot follow client id %q", id)
		}
		subs = append(subs, paho.SubscribeOptions{Topic: "clients/" + id + "/#", QoS: 0})
	}
	s.mu.Lock()
	maps.Copy(s.subs, sinks)
	s.mu.Unlock()
	sa, err := s.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: subs})
	if err != nil {
		return fmt.Errorf("spy: subscribe: %w", err)
	}
	if len(sa.Reasons) != len(subs) {
		return fmt.Errorf("spy: %d answers to %d subscriptions", len(sa.Reasons), len(subs))
	}
	for i, r := range sa.Reasons {
		if r > 2 {
			return fmt.Errorf("spy: subscription %s refused: %v", subs[i].Topic, r)
		}
	}
	return nil
}

// unfollow unsubscribes from the responses of the clients ids, in one
// UNSUBSCRIBE. Responses the store published before it took the UNSUBSCRIBE
// may still be on their way to the sinks when it returns: sync waits for
// them.
func (s *spy) unfollow(ctx context.Context, ids ...string) error {
	topics := make([]string, len(ids))
	s.mu.Lock()
	for i, id := range ids {
		delete(s.subs, id)
		topics[i] = "clients/" + id + "/#"
	}
	s.mu.Unlock()
	_, err := s.c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: topics})
	return err
}

// sync returns once the spy has handled every response the store sent it
// before it took sync's mark: the spy publishes the mark to its own topic
// and waits for it, and it handles what it gets in the order the broker
// sent it. One sync at a time.
func (s *spy) sync(ctx context.Context) error {
	select {
	case <-s.synced: // a mark from an earlier sync that timed out
	default:
	}
	if _, err := s.c.Publish(ctx, &paho.Publish{Topic: s.syncTopic, QoS: 1, Payload: []byte("mark")}); err != nil {
		return fmt.Errorf("spy: sync: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	select {
	case <-s.synced:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("spy: sync: the mark did not come back: %w", ctx.Err())
	}
}

// parking is what awaitParked waits on: a channel closed once the waiter
// parked, and a description of what was seen, for a failure message.
type parking interface {
	parkedCh() <-chan struct{}
	String() string
}

func (t *tally) parkedCh() <-chan struct{} { return t.parked }

// awaitParked waits until t has seen the waiter park: the store answered
// the waiter's first request after answering "+OK" to its KEYNOTIFY. Both
// locks watch the key before what they then sleep on (dsslock: SET,
// KEYNOTIFY, and the GET that starts the watch; the SDK: KEYNOTIFY, SET),
// so from then on the key's deletion can only reach the waiter as a
// notification, and that notification travels behind that answer on the
// waiter's connection. (A round's own rule, parkRule, may say otherwise.)
// It fails if the waiter's Lock returns (returned) first.
func awaitParked(ctx context.Context, t parking, returned <-chan struct{}) error {
	// Longer than the clients' request timeouts (10 s), so that a stall
	// shows what followed it.
	const parkTimeout = 3 * waitTimeout
	ctx, cancel := context.WithTimeout(ctx, parkTimeout)
	defer cancel()
	select {
	case <-t.parkedCh():
		return nil
	case <-returned:
		return errors.New("the waiter's Lock returned while the holder held the lock")
	case <-ctx.Done():
		return fmt.Errorf("the waiter did not park within %s (%v)", parkTimeout, t)
	}
}

// ---- 1. uncontended acquisition and release ----

// BenchmarkTryLockUnlock: one uncontended acquisition and its release, on a
// free lock. dsslock: Lock.TryLock (SET NEX PX, which also starts the
// renewal goroutine) and Lock.Unlock (stops it; VDEL). SDK: Lease.Acquire
// (SET NEX PX) and Lease.Release (VDEL), the non-blocking pair. Two requests
// each. TTL 10 s: no renewal falls in an iteration.
func BenchmarkTryLockUnlock(b *testing.B) {
	const ttl = 10 * time.Second
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		l := e.ourLock(e.ourClient("trylock"), lock.Config{Name: e.key("l"), TTL: ttl})
		ctx := e.ctx
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if ok, err := l.TryLock(ctx); !ok || err != nil {
				b.Fatalf("TryLock = %v, %v", ok, err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		l := leasedlock.NewLease(e.newClient("trylock").ss, e.key("l"))
		ctx := e.ctx
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if ok, err := l.Acquire(ctx, ttl); !ok || err != nil {
				b.Fatalf("Acquire = %v, %v", ok, err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
	})
}

// BenchmarkLockUnlock: the blocking Lock on a free lock, and Unlock. Not in
// the list of issue 7, but what an application that calls Lock pays when
// nobody else holds the lock. dsslock: one SET NEX PX (it watches only after
// a refusal), then VDEL. SDK: leasedlock.Lock sends KEYNOTIFY, SET NEX PX
// and KEYNOTIFY STOP (deferred, before Lock returns), then VDEL.
func BenchmarkLockUnlock(b *testing.B) {
	const ttl = 10 * time.Second
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		l := e.ourLock(e.ourClient("lock"), lock.Config{Name: e.key("l"), TTL: ttl})
		ctx := e.ctx
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if err := l.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		l := leasedlock.NewLock(e.newClient("lock").ss, e.key("l"))
		ctx := e.ctx
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if err := l.Lock(ctx, ttl); err != nil {
				b.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
	})
}

// ---- 2. one renewal ----

// BenchmarkRenewal: one renewal of a held lock. dsslock: what the renew
// loop sends, SET NEX PX with the holder's value (sskv.Client.Set with
// IfEqualOrNotExists and Expiry TTL; the lock is taken first with TryLock, so
// the key is the holder's). SDK: Lease.Acquire on the lease it holds, which
// is what its WithRenew goroutine does (the same SET NEX PX of the holder's
// id). One request each.
func BenchmarkRenewal(b *testing.B) {
	const ttl = 10 * time.Second
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		c := e.ourClient("renew")
		name := e.key("l")
		l := e.ourLock(c, lock.Config{Name: name, TTL: ttl})
		ctx := e.ctx
		if ok, err := l.TryLock(ctx); !ok || err != nil {
			b.Fatalf("TryLock = %v, %v", ok, err)
		}
		value := []byte(l.HolderID())
		opts := sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: ttl}
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if res, err := c.Set(ctx, name, value, opts); err != nil || !res.Applied {
				b.Fatalf("renewal = %+v, %v", res, err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		l := leasedlock.NewLease(e.newClient("renew").ss, e.key("l"))
		ctx := e.ctx
		if ok, err := l.Acquire(ctx, ttl); !ok || err != nil {
			b.Fatalf("Acquire = %v, %v", ok, err)
		}
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			if ok, err := l.Acquire(ctx, ttl); !ok || err != nil {
				b.Fatalf("renewal (Acquire) = %v, %v", ok, err)
			}
			ds = append(ds, time.Since(start))
		}
		reportPercentiles(b, ds, "ms")
		b.StopTimer()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	})
}

// ---- 3. handover ----

// locker is one side's blocking lock, as the handover needs it.
type locker struct {
	id     string // where its response topics start: clients/<id>/
	lock   func(context.Context) error
	unlock func(context.Context) error
}

// parkRule says when a round's waiter is parked, from the responses the spy
// sees to both clients.
type parkRule int

const (
	// parkAfterWatch: the waiter's first response after its first "+OK",
	// as in awaitParked. For a waiter that sleeps on the key's watch: the
	// SDK's leasedlock, dsslock's racing waiters (Config.Race) and leader.
	parkAfterWatch parkRule = iota
	// parkHolderAnswered: the holder's first response in the round. For
	// dsslock's default Lock, whose waiter queues (docs/design/queue.md): it
	// joins by writing its record to the holder's inbox key (msgJoin, or
	// msgRejoin without a read when the holder is the Lock it handed the
	// lock to), and the holder answers every join with one write to the
	// waiter's inbox (msgHead or msgAck, queue.md 4.1), after it put the
	// waiter in its queue. Once the store answered that write, the holder's
	// Unlock hands the waiter the turn, and the waiter sends nothing more
	// before it. The holder sends nothing else meanwhile: no renewal falls
	// in a round of a one-minute lease, and a holder that took the lock with
	// the turn has no roll call to make.
	parkHolderAnswered
)

// round is what the spy saw of one handover round: the responses to its
// holder and its waiter.
type round struct {
	rule parkRule

	mu     sync.Mutex
	n      int  // responses to both (= requests they made)
	sawOK  bool // the waiter got a "+OK"
	parked chan struct{}
	seen   []string // the first responses, abridged, for a failure message
}

func newRound(rule parkRule) *round { return &round{rule: rule, parked: make(chan struct{})} }

func (r *round) add(holder bool, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if len(r.seen) < 24 {
		who := "waiter"
		if holder {
			who = "holder"
		}
		r.seen = append(r.seen, fmt.Sprintf("%s:%.12q", who, payload))
	}
	park := false
	switch r.rule {
	case parkAfterWatch:
		switch {
		case holder:
		case r.sawOK:
			park = true
		case bytes.Equal(payload, respOK):
			r.sawOK = true
		}
	case parkHolderAnswered:
		park = holder
	}
	if park {
		select {
		case <-r.parked:
		default:
			close(r.parked)
		}
	}
}

func (r *round) parkedCh() <-chan struct{} { return r.parked }

func (r *round) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *round) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("%d responses: %s", r.n, strings.Join(r.seen, " "))
}

// roundSide is one client's responses, as a sink of the spy's.
type roundSide struct {
	r      *round
	holder bool
}

func (s roundSide) add(payload []byte) { s.r.add(s.holder, payload) }

// sinks routes the holder's and the waiter's responses to r.
func (r *round) sinks(holder, waiter locker) map[string]sink {
	return map[string]sink{holder.id: roundSide{r, true}, waiter.id: roundSide{r, false}}
}

// route points the spy's existing subscriptions of the clients in sinks at
// new sinks, with no request to the broker.
func (s *spy) route(sinks map[string]sink) {
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.Copy(s.subs, sinks)
}

// storeCPU returns the CPU time the store process has used so far: the sum
// of its threads' run times, /proc/<pid>/task/*/schedstat, in nanoseconds
// (/proc/<pid>/stat counts 10 ms ticks, too coarse for a handover). A thread
// that ends takes its time with it; the Go runtime hardly ever ends one.
// ok is false when the store is not this suite's child
// (DSSLOCK_STATESTORE_ADDR) or the file cannot be read (not Linux).
func storeCPU() (d time.Duration, ok bool) {
	if storePID == 0 {
		return 0, false
	}
	dir := fmt.Sprintf("/proc/%d/task", storePID)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false
		}
		d += time.Duration(ns)
	}
	return d, true
}

// handoverWarmRounds is how many untimed rounds come first.
const handoverWarmRounds = 50

// handoverCountRounds is how many rounds, after the timed ones, count the
// requests of a handover.
const handoverCountRounds = 20

// handover measures, round after round, the handover of a lock between two
// clients whose roles swap every round: the holder holds; the waiter calls
// Lock (on a goroutine) and parks, which the spy sees (rule, see parkRule;
// the spy follows both clients' responses); then the holder calls Unlock.
// Reported:
//
//   - p50-ms, p99-ms: from the start of the holder's Unlock to the waiter's
//     Lock returning. The spy subscribes (one SUBSCRIBE for both clients)
//     before the waiter starts and unsubscribes (UNSUBACK) before the clock
//     starts, so the timed part carries no extra traffic.
//   - reqs/handover: every request both clients made, the waiter's entry
//     and the handover, counted from outside as the store's responses
//     (one per request executed) in handoverCountRounds more rounds after
//     the timed ones, in which the spy follows both clients all along (and
//     syncs after each round, so a late response counts too).
//   - store-cpu-us/handover: the store process's CPU time (storeCPU) over
//     the timed rounds, all of it (the round's requests, their
//     notifications and what trails them), less spy-cpu-us/handover, per
//     round. It still holds the spy's copies of the responses up to the
//     parking: two per round for dsslock-queue (the rejoin's, the holder's
//     answer) and for sdk (KEYNOTIFY's, the refused SET's), three for a
//     dsslock waiter that races (the refused SET's, KEYNOTIFY's, the GET's).
//   - spy-cpu-us/handover: the store's CPU time for the spy's SUBSCRIBE and
//     UNSUBSCRIBE of a round, measured after the timed rounds by as many
//     pairs of them with both clients idle.
//
// The store CPU metrics are not reported with an external store. Both sides
// are measured by this same code, against the same store, with nothing else
// running on it.
//
// handoverWarmRounds untimed rounds come first: after the first two, each
// client has waited once and held once, as in every later round (dsslock's
// queued Lock has then its inbox watched and, locking again, rejoins the
// Lock it handed the lock to); the others warm the store process, so that
// the first sub-benchmark of a run does not pay for its start (its store
// CPU per handover came out about a tenth higher in the first place of the
// run than in the second without them). The first round parks by
// parkAfterWatch whatever rule says: its holder took a free key, so it keeps
// no queue yet and answers no join.
func handover(b *testing.B, e *env, ls [2]locker, rule parkRule) {
	ctx := e.ctx
	sp := e.newSpy()
	i := 0 // rounds so far: ls[i%2] holds
	// play runs one round; atPark runs between the parking and the Unlock.
	play := func(r *round, holder, waiter locker, atPark func()) time.Duration {
		got := make(chan time.Time, 1)
		returned := make(chan struct{})
		var lockErr error
		go func() {
			defer close(returned)
			lockErr = waiter.lock(ctx)
			got <- time.Now()
		}()
		if err := awaitParked(ctx, r, returned); err != nil {
			b.Fatal(err)
		}
		if atPark != nil {
			atPark()
		}
		start := time.Now()
		if err := holder.unlock(ctx); err != nil {
			b.Fatal(err)
		}
		end := <-got
		if lockErr != nil {
			b.Fatalf("waiter's Lock: %v", lockErr)
		}
		return end.Sub(start)
	}
	// once runs a round with the spy subscribed up to the parking.
	once := func(rule parkRule) time.Duration {
		holder, waiter := ls[i%2], ls[(i+1)%2]
		i++
		r := newRound(rule)
		if err := sp.subscribe(ctx, r.sinks(holder, waiter)); err != nil {
			b.Fatal(err)
		}
		return play(r, holder, waiter, func() {
			if err := sp.unfollow(ctx, holder.id, waiter.id); err != nil {
				b.Fatal(err)
			}
		})
	}

	if err := ls[0].lock(ctx); err != nil {
		b.Fatal(err)
	}
	once(parkAfterWatch)
	for range handoverWarmRounds - 1 {
		once(rule)
	}

	// The timed rounds.
	cpu0, cpuOK := storeCPU()
	ds := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	for b.Loop() {
		ds = append(ds, once(rule))
	}
	cpu1, ok := storeCPU()
	cpuOK = cpuOK && ok
	reportPercentiles(b, ds, "ms")

	// What the spy's SUBSCRIBE and UNSUBSCRIBE cost the store, as many as
	// in the timed rounds, with both clients idle.
	spy0, ok := storeCPU()
	cpuOK = cpuOK && ok
	for range ds {
		if err := sp.subscribe(ctx, newRound(rule).sinks(ls[0], ls[1])); err != nil {
			b.Fatal(err)
		}
		if err := sp.unfollow(ctx, ls[0].id, ls[1].id); err != nil {
			b.Fatal(err)
		}
	}
	spy1, ok := storeCPU()
	cpuOK = cpuOK && ok
	if cpuOK {
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(len(ds)) }
		b.ReportMetric(us(cpu1-cpu0)-us(spy1-spy0), "store-cpu-us/handover")
		b.ReportMetric(us(spy1-spy0), "spy-cpu-us/handover")
	}

	// The counted rounds.
	var rs []*round
	for k := range handoverCountRounds {
		holder, waiter := ls[i%2], ls[(i+1)%2]
		i++
		r := newRound(rule)
		if k == 0 {
			if err := sp.subscribe(ctx, r.sinks(holder, waiter)); err != nil {
				b.Fatal(err)
			}
		} else {
			sp.route(r.sinks(holder, waiter))
		}
		play(r, holder, waiter, nil)
		if err := sp.sync(ctx); err != nil {
			b.Fatal(err)
		}
		rs = append(rs, r)
	}
	if err := sp.unfollow(ctx, ls[0].id, ls[1].id); err != nil {
		b.Fatal(err)
	}
	if err := sp.sync(ctx); err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, r := range rs {
		n += r.count()
	}
	b.ReportMetric(float64(n)/handoverCountRounds, "reqs/handover")
}

// BenchmarkHandover: see handover. Both hold the lock for a minute (no
// renewal falls in a round).
//
//   - dsslock-queue: lock's default Lock, whose waiters queue
//     (docs/design/queue.md); parkHolderAnswered. Locking again, the waiter
//     rejoins the Lock it handed the lock to (a SET of its inbox) and the
//     holder tells it to watch the key (a SET); the holder's Unlock sends
//     the turn (a SET of the waiter's inbox) and a VDEL; the waiter, which
//     kept its watch of the key, then sends one SET NEX PX.
//   - dsslock: Config.Race, waiters that race as the SDK's do;
//     parkAfterWatch.
//   - dsslock-leader: leader.Campaign and Term.Resign; parkAfterWatch.
//   - sdk: leasedlock.Lock and Unlock; parkAfterWatch. The waiter sends
//     KEYNOTIFY and a refused SET NX PX, wakes on the DELETE notification of
//     the holder's VDEL, sends a SET NX PX and then KEYNOTIFY STOP, which its
//     Lock waits for before it returns.
func BenchmarkHandover(b *testing.B) {
	b.Run("dsslock-queue", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		var ls [2]locker
		for j := range ls {
			c := e.ourClient(fmt.Sprintf("handover%d", j))
			l := e.ourLock(c, lock.Config{Name: name, TTL: time.Minute})
			ls[j] = locker{id: c.ID(), lock: l.Lock, unlock: l.Unlock}
		}
		handover(b, e, ls, parkHolderAnswered)
	})
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		var ls [2]locker
		for j := range ls {
			c := e.ourClient(fmt.Sprintf("handover%d", j))
			// Race: waiters that race, as the SDK's do (dsslock-queue is
			// the default Lock).
			l := e.ourLock(c, lock.Config{Name: name, TTL: time.Minute, Race: true})
			ls[j] = locker{id: c.ID(), lock: l.Lock, unlock: l.Unlock}
		}
		handover(b, e, ls, parkAfterWatch)
	})
	// Resign to new leader (package leader): the follower wakes on the
	// DELETE and sends two SETs, the one that takes the key and the fenced
	// one that records its term's token. The SDK has no leader election; its
	// lock handover above is the comparison.
	b.Run("dsslock-leader", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("e")
		var ls [2]locker
		for j := range ls {
			c := e.ourClient(fmt.Sprintf("handover%d", j))
			var term *leader.Term
			ls[j] = locker{
				id: c.ID(),
				lock: func(ctx context.Context) (err error) {
					term, err = leader.Campaign(ctx, c, name, []byte{byte('0' + j)}, leader.WithTTL(time.Minute))
					return err
				},
				unlock: func(ctx context.Context) error { return term.Resign(ctx) },
			}
		}
		handover(b, e, ls, parkAfterWatch)
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		var ls [2]locker
		for j := range ls {
			c := e.newClient(fmt.Sprintf("handover%d", j))
			l := leasedlock.NewLock(c.ss, name)
			ls[j] = locker{
				id:     c.respSegment(),
				lock:   func(ctx context.Context) error { return l.Lock(ctx, time.Minute) },
				unlock: func(ctx context.Context) error { return l.Unlock(ctx) },
			}
		}
		handover(b, e, ls, parkAfterWatch)
	})
}

// ---- 4. crash takeover ----

// crashTTL is the lease of BenchmarkCrashTakeover: the same for both (the
// SDK accepts any whole number of milliseconds).
const crashTTL = 100 * time.Millisecond

// BenchmarkCrashTakeover: a holder on a fresh client acquires the lock with
// a TTL of 100 ms and its client is closed right after (no renewal, no
// release); a waiter on a long-lived client then calls Lock, parks on its
// watch (within a millisecond or two, well inside the TTL) and takes the
// lock when the store expires the key and notifies the DELETE. Timed from
// just before the holder's acquisition is sent to the waiter's Lock
// returning, minus the TTL: the store's expiry lateness, the notification,
// and the waiter's acquisition (plus, for the SDK, its KEYNOTIFY STOP). The
// holder's client is dialled before the clock starts. Each round starts
// with the previous waiter's Unlock.
func BenchmarkCrashTakeover(b *testing.B) {
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		waiter := e.ourLock(e.ourClient("crash-waiter"), lock.Config{Name: name, TTL: crashTTL})
		ctx := e.ctx
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			if waiter.Err() == nil {
				if err := waiter.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			c := e.ourClient("crash-holder")
			holder, err := lock.New(c, lock.Config{Name: name, TTL: crashTTL})
			if err != nil {
				b.Fatal(err)
			}
			sent := time.Now()
			if ok, err := holder.TryLock(ctx); !ok || err != nil {
				b.Fatalf("TryLock = %v, %v", ok, err)
			}
			_ = c.Close() // the holder crashes: no more renewals, no release
			if err := waiter.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			ds = append(ds, time.Since(sent)-crashTTL)
		}
		reportPercentiles(b, ds, "ms-over-TTL")
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		waiter := leasedlock.NewLock(e.newClient("crash-waiter").ss, name)
		ctx := e.ctx
		held := false
		ds := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		for b.Loop() {
			if held {
				if err := waiter.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			c := e.newClient("crash-holder")
			holder := leasedlock.NewLease(c.ss, name)
			sent := time.Now()
			if ok, err := holder.Acquire(ctx, crashTTL); !ok || err != nil {
				b.Fatalf("Acquire = %v, %v", ok, err)
			}
			c.close() // the holder crashes: no more renewals, no release
			if err := waiter.Lock(ctx, crashTTL); err != nil {
				b.Fatal(err)
			}
			held = true
			ds = append(ds, time.Since(sent)-crashTTL)
		}
		reportPercentiles(b, ds, "ms-over-TTL")
	})
}

// ---- 5. requests of waiters while the holder renews ----

const (
	// waitTTL is the holder's lease in BenchmarkWaiterRequests; it renews
	// every third of it.
	waitTTL = 200 * time.Millisecond
	// waitTTLs is how long the waiters are watched after their entry.
	waitTTLs = 10
	// waitBatch bounds the waiters that wait together in one window.
	waitBatch = 50
)

// waiterSide is one side of BenchmarkWaiterRequests: a waiter that blocks in
// Lock until ctx ends, on a client of its own.
type waiterSide struct {
	id   string // where its response topics start: clients/<id>/
	lock func(context.Context) error
	stop func() // closes the client
}

// waiterRequests counts the requests of waiters while a holder keeps
// renewing: each iteration is one waiter, on a client of its own; up to
// waitBatch of them enter together (Lock in a goroutine each), and each is
// watched for waitTTLs TTLs from its parking. The store's responses, which
// the spy counts, are the requests it executed (one response each). Reported per waiter: the requests from its Lock call to
// its parking (entry-reqs), and in the waitTTLs TTLs after its parking
// (reqs-after-entry). A window takes about 2 s, so the iterations are
// batched; ns/op is the window's time shared among its waiters.
func waiterRequests(b *testing.B, e *env, newWaiter func(i int) waiterSide) {
	ctx := e.ctx
	sp := e.newSpy()
	var entry, after, waiters int
	b.ReportAllocs()
	for done := 0; done < b.N; {
		n := min(waitBatch, b.N-done)
		b.StopTimer()
		ws := make([]waiterSide, n)
		ts := make([]*tally, n)
		for i := range ws {
			ws[i] = newWaiter(done + i)
			t, err := sp.follow(ctx, ws[i].id)
			if err != nil {
				b.Fatal(err)
			}
			ts[i] = t
		}
		b.StartTimer()
		wctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		returned := make([]chan struct{}, n)
		errs := make([]error, n)
		for i := range ws {
			returned[i] = make(chan struct{})
			wg.Go(func() {
				defer close(returned[i])
				errs[i] = ws[i].lock(wctx)
			})
		}
		for i := range ws {
			if err := awaitParked(ctx, ts[i], returned[i]); err != nil {
				cancel()
				b.Fatal(err)
			}
		}
		// Each waiter's window: waitTTLs TTLs from its parking, taken in
		// the order they parked.
		slices.SortFunc(ts, func(x, y *tally) int { _, px := x.entry(); _, py := y.entry(); return px.Compare(py) })
		for _, t := range ts {
			k, at := t.entry()
			time.Sleep(time.Until(at.Add(waitTTLs * waitTTL)))
			entry += k
			after += t.count() - k
		}
		for i := range ws {
			select {
			case <-returned[i]:
				b.Fatalf("waiter %d's Lock returned during the window: %v", i, errs[i])
			default:
			}
		}
		cancel()
		wg.Wait()
		b.StopTimer()
		for i, w := range ws {
			if err := sp.unfollow(ctx, w.id); err != nil {
				b.Fatal(err)
			}
			w.stop()
			if !errors.Is(errs[i], context.Canceled) {
				b.Fatalf("waiter %d's Lock = %v, want context.Canceled", i, errs[i])
			}
		}
		b.StartTimer()
		done += n
		waiters += n
	}
	b.ReportMetric(float64(entry)/float64(waiters), "entry-reqs/waiter")
	b.ReportMetric(float64(after)/float64(waiters), "reqs-after-entry/waiter")
}

// BenchmarkWaiterRequests: see waiterRequests. The holder's lease is 200 ms,
// renewed every 66 ms on both sides (dsslock: TTL 200 ms, whose default
// RenewInterval is TTL/3; the SDK: WithRenew(66ms)), so each waiter sees
// about 30 renewals (SET notifications) in its window. dsslock's waiters
// race (Config.Race), as the SDK's do: a batch of 50 queued waiters
// entering at once held up this 200 ms lease's renewals past its renew
// deadline (their joins notify each other).
func BenchmarkWaiterRequests(b *testing.B) {
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		holder := e.ourLock(e.ourClient("renewing-holder"), lock.Config{Name: name, TTL: waitTTL})
		if ok, err := holder.TryLock(e.ctx); !ok || err != nil {
			b.Fatalf("TryLock = %v, %v", ok, err)
		}
		waiterRequests(b, e, func(i int) waiterSide {
			c := e.ourClient(fmt.Sprintf("waiter%d", i))
			l := e.ourLock(c, lock.Config{Name: name, TTL: waitTTL, Race: true})
			return waiterSide{id: c.ID(), lock: l.Lock, stop: func() { _ = c.Close() }}
		})
		if err := holder.Err(); err != nil {
			b.Fatalf("the holder lost the lock: %v", err)
		}
	})
	b.Run("sdk", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		// The holder is ended by closing its client, not by Release: in SDK
		// v0.4.1, Release after WithRenew leaves the renew goroutine
		// spinning (see TestLease/AutoRenew).
		hc := e.newClient("renewing-holder")
		holder := leasedlock.NewLease(hc.ss, name)
		if ok, err := holder.Acquire(e.ctx, waitTTL, leasedlock.WithRenew(waitTTL/3)); !ok || err != nil {
			b.Fatalf("Acquire = %v, %v", ok, err)
		}
		b.Cleanup(hc.close)
		waiterRequests(b, e, func(i int) waiterSide {
			c := e.newClient(fmt.Sprintf("waiter%d", i))
			l := leasedlock.NewLock(c.ss, name)
			return waiterSide{
				id:   c.respSegment(),
				lock: func(ctx context.Context) error { return l.Lock(ctx, waitTTL) },
				stop: c.close,
			}
		})
		if h, ok, err := holder.Holder(e.ctx); err != nil || !ok || h != hc.id {
			b.Fatalf("Holder = %q, %v, %v; want the renewing holder %q", h, ok, err, hc.id)
		}
	})
}
