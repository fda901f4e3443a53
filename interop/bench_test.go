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
	"net"
	"slices"
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
	subs map[string]*tally // by response topic segment
}

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
	s := &spy{subs: make(map[string]*tally)}
	s.c = paho.NewClient(paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			s.seen(pr.Packet)
			return true, nil
		}},
	})
	if _, err := s.c.Connect(e.ctx, &paho.Connect{ClientID: "spy-" + randHex(4), KeepAlive: 60, CleanStart: true}); err != nil {
		e.t.Fatalf("spy: connect: %v", err)
	}
	e.t.Cleanup(func() {
		_ = s.c.Disconnect(&paho.Disconnect{})
		<-s.c.Done()
	})
	return s
}

func (s *spy) seen(p *paho.Publish) {
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
	if id == "statestore" || strings.ContainsAny(id, "/+#") {
		return nil, fmt.Errorf("spy: cannot follow client id %q", id)
	}
	t := &tally{parked: make(chan struct{})}
	s.mu.Lock()
	s.subs[id] = t
	s.mu.Unlock()
	sa, err := s.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "clients/" + id + "/#", QoS: 0}}})
	if err != nil {
		return nil, fmt.Errorf("spy: subscribe: %w", err)
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] > 2 {
		return nil, fmt.Errorf("spy: subscription to %s refused: %v", id, sa.Reasons)
	}
	return t, nil
}

// unfollow unsubscribes from id's responses.
func (s *spy) unfollow(ctx context.Context, id string) error {
	s.mu.Lock()
	delete(s.subs, id)
	s.mu.Unlock()
	_, err := s.c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"clients/" + id + "/#"}})
	return err
}

// awaitParked waits until t has seen the waiter park: the store answered
// the waiter's first request after answering "+OK" to its KEYNOTIFY. Both
// locks watch the key before what they then sleep on (dsslock: SET,
// KEYNOTIFY, and the GET that starts the watch; the SDK: KEYNOTIFY, SET),
// so from then on the key's deletion can only reach the waiter as a
// notification, and that notification travels behind that answer on the
// waiter's connection. It fails if the waiter's Lock returns (returned)
// first.
func awaitParked(ctx context.Context, t *tally, returned <-chan struct{}) error {
	// Longer than the clients' request timeouts (10 s), so that a stall
	// shows what followed it.
	const parkTimeout = 3 * waitTimeout
	ctx, cancel := context.WithTimeout(ctx, parkTimeout)
	defer cancel()
	select {
	case <-t.parked:
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

// handover times, round after round, from the start of the holder's Unlock
// to the waiter's Lock returning, between two clients whose roles swap every
// round. Before the holder lets go, the waiter is parked on its watch: the
// spy has seen the store answer the waiter's request after its KEYNOTIFY
// (see awaitParked), the same signal for both sides. The spy is
// subscribed only during that wait (SUBACK before the waiter starts, UNSUBACK
// before the clock starts), so the timed part carries no extra traffic.
func handover(b *testing.B, e *env, ls [2]locker) {
	ctx := e.ctx
	sp := e.newSpy()
	if err := ls[0].lock(ctx); err != nil {
		b.Fatal(err)
	}
	ds := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		holder, waiter := ls[i%2], ls[(i+1)%2]
		i++
		t, err := sp.follow(ctx, waiter.id)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		returned := make(chan struct{})
		var lockErr error
		go func() {
			defer close(returned)
			lockErr = waiter.lock(ctx)
			got <- time.Now()
		}()
		if err := awaitParked(ctx, t, returned); err != nil {
			b.Fatal(err)
		}
		if err := sp.unfollow(ctx, waiter.id); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := holder.unlock(ctx); err != nil {
			b.Fatal(err)
		}
		end := <-got
		if lockErr != nil {
			b.Fatalf("waiter's Lock: %v", lockErr)
		}
		ds = append(ds, end.Sub(start))
	}
	reportPercentiles(b, ds, "ms")
}

// BenchmarkHandover: see handover. Both hold the lock for a minute (no
// renewal falls in a round). dsslock's waiter wakes on the DELETE
// notification and sends one SET NEX PX; the SDK's does the same and then
// KEYNOTIFY STOP, which its Lock waits for before it returns.
func BenchmarkHandover(b *testing.B) {
	b.Run("dsslock", func(b *testing.B) {
		e := newBenchEnv(b)
		name := e.key("l")
		var ls [2]locker
		for j := range ls {
			c := e.ourClient(fmt.Sprintf("handover%d", j))
			// Race: the SDK's waiters race, and the parking signal (a
			// refused SET after the KEYNOTIFY) is a racing waiter's; the
			// queue's own handover is lock's BenchmarkHandover.
			l := e.ourLock(c, lock.Config{Name: name, TTL: time.Minute, Race: true})
			ls[j] = locker{id: c.ID(), lock: l.Lock, unlock: l.Unlock}
		}
		handover(b, e, ls)
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
		handover(b, e, ls)
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
		handover(b, e, ls)
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
