package sskv_test

// Stress tests of the publisher (publisher.go) under faults at random
// moments, from an adversarial review: slots after cancel storms, requests
// that report ErrNotSent never executed, Close during bursts, restarts and
// session expiry in the middle of bursts. They take about half a minute
// with -race: set DSSLOCK_STRESS=1 to run them.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func stressOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("DSSLOCK_STRESS") == "" {
		t.Skip("a stress test: set DSSLOCK_STRESS=1 to run it")
	}
}

// advSlots is half the local store's Receive Maximum (1024).
const advSlots = 512

// advPatient makes a client that does not replace a frozen connection by
// itself for a minute.
func advPatient(cfg *sskv.Config) {
	cfg.KeepAlive = 60 * time.Second
	cfg.PingTimeout = 60 * time.Second
}

// advCapacity freezes the path and fires n > advSlots requests on c's
// current connection; it returns the most requests paho's session held at
// once (each holds one slot), then heals the path and checks that all were
// answered.
func advCapacity(t *testing.T, c *sskv.Client, p *faultproxy.Proxy, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p.Blackhole()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Get(ctx, fmt.Sprintf("cap%d", i)); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	peak := 0
	deadline := time.Now().Add(5 * time.Second)
	stable := time.Time{}
	for time.Now().Before(deadline) {
		st := sskv.PublisherStateForTest(c)
		if st.Tracked > peak {
			peak, stable = st.Tracked, time.Now()
		}
		if peak >= advSlots || (!stable.IsZero() && time.Since(stable) > time.Second) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	p.Heal()
	wg.Wait()
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed after the path healed; first: %v", failed.Load(), n, firstErr.Load())
	}
	return peak
}

// After a storm of requests whose callers give up at random moments (some
// while queued, some while waiting for a slot, some in flight), on the same
// connection, every slot must still be free: the connection still takes
// Receive Maximum/2 requests at once.
func TestStressPublisherSlotsAfterCancelStorm(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 4 << 20})
	c := dial(t, srv, viaProxy(p), advPatient)
	ctx := testCtx(t)
	cn, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if peak := advCapacity(t, c, p, advSlots+100); peak != advSlots {
		t.Fatalf("fresh connection: peak %d requests in flight, want %d", peak, advSlots)
	}
	for round := range 4 {
		switch round % 3 {
		case 0:
			p.Blackhole()
			time.AfterFunc(time.Duration(50+rand.IntN(250))*time.Millisecond, p.Heal)
		case 1:
			p.SetDelay(time.Duration(5+rand.IntN(40)) * time.Millisecond)
		}
		var wg sync.WaitGroup
		for i := range 1500 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(time.Duration(rand.IntN(400))*time.Millisecond, cancel)
				defer cancel()
				var v []byte
				if i%100 == 0 {
					v = make([]byte, 64<<10)
				}
				_, _ = c.Set(rctx, fmt.Sprintf("s%d", i%50), v, sskv.SetOptions{})
			}()
			if i%300 == 0 {
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
			}
		}
		wg.Wait()
		p.Heal()
		p.SetDelay(0)
	}
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if now, _ := c.Connection(ctx); now != cn {
		t.Skipf("the connection was replaced (%d -> %d): the test proves nothing", cn.Number(), now.Number())
	}
	waitIdle(t, c)
	if peak := advCapacity(t, c, p, advSlots+100); peak != advSlots {
		t.Fatalf("after the storm, same connection: peak %d requests in flight, want %d (slots leaked: %d)", peak, advSlots, advSlots-peak)
	}
	if now, _ := c.Connection(ctx); now != cn {
		t.Fatalf("connection replaced during the capacity probe")
	}
}

func waitIdle(t *testing.T, c *sskv.Client) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := sskv.PublisherStateForTest(c)
		if !st.Running && st.Tracked == 0 && st.Queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publisher not idle: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// outcomes records what the SETs of a burst reported, to check against
// the store once the faults are over.
type outcomes struct {
	mu      sync.Mutex
	notSent map[string]error // told ErrNotSent: must never be executed
	ok      map[string]bool  // acknowledged: must be in the store
	late    []string         // callers that returned over a second past their deadline
	n       atomic.Int64

	wg   sync.WaitGroup
	stop chan struct{}
}

// burst starts workers that send rounds of per SETs each (keys with
// prefix), until halt. Every worker's requests (allBound), or the odd
// workers', go through the Conn of the moment, bound to it. Each has a
// deadline from deadline(); with cancelEarly, one in four is cancelled
// before it, at a random moment.
func burst(ctx context.Context, c *sskv.Client, prefix string, workers, per int, allBound, cancelEarly bool, deadline func() time.Duration) *outcomes {
	o := &outcomes{notSent: map[string]error{}, ok: map[string]bool{}, stop: make(chan struct{})}
	for w := range workers {
		o.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-o.stop:
					return
				default:
				}
				var cn *sskv.Conn
				if allBound || w%2 == 1 {
					cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
					var err error
					cn, err = c.Connection(cctx)
					cancel()
					if err != nil {
						continue
					}
				}
				var iw sync.WaitGroup
				for j := range per {
					iw.Go(func() { o.set(ctx, c, cn, fmt.Sprintf("%s%d-%d-%d", prefix, w, i, j), deadline(), cancelEarly) })
				}
				iw.Wait()
			}
		})
	}
	return o
}

// set makes one SET of key (through cn unless nil) and records its outcome.
func (o *outcomes) set(ctx context.Context, c *sskv.Client, cn *sskv.Conn, key string, d time.Duration, cancelEarly bool) {
	o.n.Add(1)
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if cancelEarly && rand.IntN(4) == 0 {
		time.AfterFunc(time.Duration(rand.IntN(int(d))), cancel)
	}
	start := time.Now()
	var err error
	if cn != nil {
		_, err = cn.Set(rctx, key, []byte("v"), sskv.SetOptions{})
	} else {
		_, err = c.Set(rctx, key, []byte("v"), sskv.SetOptions{})
	}
	el := time.Since(start)
	o.mu.Lock()
	defer o.mu.Unlock()
	if el > d+time.Second {
		o.late = append(o.late, fmt.Sprintf("%s: %v past a %v deadline: %v", key, el-d, d, err))
	}
	switch {
	case err == nil:
		o.ok[key] = true
	case errors.Is(err, sskv.ErrNotSent):
		o.notSent[key] = err
	}
}

// halt stops the workers and waits for their requests to return.
func (o *outcomes) halt() {
	close(o.stop)
	o.wg.Wait()
}

// check reports callers that returned late, requests executed although
// their callers were told ErrNotSent, and acknowledged requests missing
// from the store; then that c's publisher is idle.
func (o *outcomes) check(t *testing.T, ctx context.Context, c *sskv.Client) {
	t.Helper()
	t.Logf("%d requests: %d ok, %d not sent", o.n.Load(), len(o.ok), len(o.notSent))
	for _, l := range o.late {
		t.Errorf("late: %s", l)
	}
	// A round trip, and a moment for anything still on its way to the
	// store: a late execution is an absence of a signal.
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	for key, err := range o.notSent {
		if g, gerr := c.Get(ctx, key); gerr != nil {
			t.Fatal(gerr)
		} else if g.Found {
			t.Errorf("%s executed after its caller was told: %v", key, err)
		}
	}
	for key := range o.ok {
		if g, gerr := c.Get(ctx, key); gerr != nil {
			t.Fatal(gerr)
		} else if !g.Found {
			t.Errorf("%s reported done but not in the store", key)
		}
	}
	waitIdle(t, c)
}

// Requests bound to a Conn, made while the connection is cut again and
// again: a request whose caller was told ErrNotSent must never be executed.
func TestStressPublisherBoundNotSentNeverExecuted(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p))
	ctx := testCtx(t)
	o := burst(ctx, c, "b", 8, 40, true, false, func() time.Duration {
		return time.Duration(50+rand.IntN(500)) * time.Millisecond
	})
	for range 15 {
		time.Sleep(time.Duration(20+rand.IntN(80)) * time.Millisecond)
		p.Cut()
	}
	o.halt()
	o.check(t, ctx, c)
}

// Close while the writer is stuck writing a large SET to a frozen
// connection, with more queued behind it and many more in flight: Close
// returns promptly and so does every caller.
func TestStressPublisherCloseDuringFrozenBurst(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 32 << 10})
	c := dial(t, srv, viaProxy(p), advPatient)
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	big := make([]byte, 1<<20)
	var wg sync.WaitGroup
	var returned atomic.Int64
	const nbig, nsmall = 6, 300
	for i := range nbig + nsmall {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer returned.Add(1)
			if i < nbig {
				_, _ = c.Set(ctx, fmt.Sprintf("big%d", i), big, sskv.SetOptions{})
			} else {
				_, _ = c.Get(ctx, fmt.Sprintf("small%d", i))
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	t.Logf("before Close: %+v", sskv.PublisherStateForTest(c))
	start := time.Now()
	done := make(chan struct{})
	go func() { _ = c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Close hung for 5s; publisher %+v; %d of %d callers returned", sskv.PublisherStateForTest(c), returned.Load(), nbig+nsmall)
	}
	t.Logf("Close took %v", time.Since(start))
	cw := make(chan struct{})
	go func() { wg.Wait(); close(cw) }()
	select {
	case <-cw:
	case <-time.After(3 * time.Second):
		t.Fatalf("callers still blocked 3s after Close: %d of %d returned; publisher %+v", returned.Load(), nbig+nsmall, sskv.PublisherStateForTest(c))
	}
	if st := sskv.PublisherStateForTest(c); st.Running || st.Tracked != 0 || st.Queued != 0 {
		t.Errorf("publisher after Close: %+v", st)
	}
	p.Heal()
}

// The store restarts (the session is lost) while requests are queued and
// in flight on a frozen path; every caller returns by its deadline, the
// publisher ends idle, and the next connection takes Receive Maximum/2
// requests at once.
func TestStressPublisherRestartMidBurst(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 4 << 20})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) {
		cfg.KeepAlive = 2 * time.Second
		cfg.PingTimeout = 500 * time.Millisecond
	})
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		p.Blackhole()
		var wg sync.WaitGroup
		var late atomic.Int64
		for i := range 800 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := time.Duration(200+rand.IntN(3000)) * time.Millisecond
				rctx, cancel := context.WithTimeout(ctx, d)
				defer cancel()
				start := time.Now()
				_, _ = c.Set(rctx, fmt.Sprintf("r%d", i), []byte("v"), sskv.SetOptions{})
				if over := time.Since(start) - d; over > time.Second {
					late.Add(1)
				}
			}()
		}
		time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
		srv = restartAt(t, srv)
		p.Heal()
		wg.Wait()
		if late.Load() > 0 {
			t.Errorf("round %d: %d requests returned more than 1s past their deadline", round, late.Load())
		}
	}
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, c)
}

func restartAt(t *testing.T, srv *localstore.Server) *localstore.Server {
	t.Helper()
	addr := srv.Addr()
	_ = srv.Close()
	next, err := localstore.Start(localstore.Config{Addr: addr})
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = next.Close() })
	return next
}

// Chaos: unbound and bound requests with random deadlines while the
// connection is kicked (DISCONNECT), dropped, cut at the proxy, frozen and
// healed. Every caller returns by its deadline (plus a margin), a request
// told ErrNotSent is never executed, a request that succeeded was executed,
// and afterwards the connection takes Receive Maximum/2 requests at once.
func TestStressPublisherChaos(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 4 << 20})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) {
		cfg.KeepAlive = 60 * time.Second
		cfg.PingTimeout = 60 * time.Second
	})
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	o := burst(ctx, c, "c", 16, 30, false, true, func() time.Duration {
		return time.Duration(20+rand.IntN(700)) * time.Millisecond
	})
	for k := range 24 {
		time.Sleep(time.Duration(30+rand.IntN(120)) * time.Millisecond)
		switch k % 5 {
		case 0:
			_ = srv.Kick(c.ID())
		case 1:
			_ = srv.Drop(c.ID())
		case 2:
			p.Cut()
		case 3:
			p.Blackhole()
			time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
			p.Heal()
		case 4:
			p.SetDelay(time.Duration(rand.IntN(20)) * time.Millisecond)
		}
	}
	p.SetDelay(0)
	p.Heal()
	o.halt()
	o.check(t, ctx, c)
	if peak := advCapacity(t, c, p, advSlots+100); peak != advSlots {
		t.Errorf("after the chaos: peak %d requests in flight, want %d", peak, advSlots)
	}
}

// Requests bound to a Conn wait behind a large SET the writer is stuck
// writing to a frozen connection; the connection is then cut (or the client
// kicked) and replaced. Those told ErrNotSent must never be executed, and
// none may outlive its deadline.
func TestStressPublisherBoundQueuedBehindStuckWrite(t *testing.T) {
	stressOnly(t)
	for round := range 4 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			srv := startStore(t, localstore.Config{})
			p := startProxy(t, srv, faultproxy.Options{BufferSize: 32 << 10})
			c := dial(t, srv, viaProxy(p), advPatient)
			ctx := testCtx(t)
			cn, err := c.Connection(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Blackhole()
			big := make([]byte, 1<<20)
			var wg sync.WaitGroup
			for i := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = cn.Set(ctx, fmt.Sprintf("big%d", i), big, sskv.SetOptions{})
				}()
			}
			advEventually(t, func() bool { return sskv.PublisherStateForTest(c).Queued >= 2 })
			var mu sync.Mutex
			notSent := map[string]error{}
			var late []string
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					key := fmt.Sprintf("q%d", i)
					d := time.Duration(300+rand.IntN(2000)) * time.Millisecond
					rctx, cancel := context.WithTimeout(ctx, d)
					defer cancel()
					start := time.Now()
					var err error
					if i%2 == 0 {
						_, err = cn.Set(rctx, key, []byte("v"), sskv.SetOptions{})
					} else {
						_, err = c.Set(rctx, key+"u", []byte("v"), sskv.SetOptions{})
					}
					mu.Lock()
					defer mu.Unlock()
					if el := time.Since(start); el > d+time.Second {
						late = append(late, fmt.Sprintf("%s %v (deadline %v): %v", key, el, d, err))
					}
					if errors.Is(err, sskv.ErrNotSent) {
						notSent[key] = err
					}
				}()
			}
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
			if round%2 == 0 {
				p.Cut()
			} else {
				_ = srv.Drop(c.ID())
				p.Cut()
			}
			p.Heal()
			wg.Wait()
			for _, l := range late {
				t.Errorf("late: %s", l)
			}
			if _, err := c.Set(ctx, "after", []byte("v"), sskv.SetOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			t.Logf("%d not sent; publisher %+v", len(notSent), sskv.PublisherStateForTest(c))
			for key, err := range notSent {
				g, gerr := c.Get(ctx, key)
				if gerr != nil {
					t.Fatal(gerr)
				}
				if g.Found {
					t.Errorf("%s executed after its caller was told: %v", key, err)
				}
			}
			waitIdle(t, c)
		})
	}
}

func advEventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// Close at a random moment of a burst, with or without faults: Close and
// every caller return promptly, and the publisher is left empty.
func TestStressPublisherCloseRandom(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 64 << 10})
	for it := range 12 {
		c := dial(t, srv, viaProxy(p), advPatient)
		ctx := testCtx(t)
		var wg sync.WaitGroup
		var returned atomic.Int64
		const n = 400
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer returned.Add(1)
				rctx, cancel := context.WithTimeout(ctx, time.Duration(10+rand.IntN(2000))*time.Millisecond)
				defer cancel()
				var v []byte
				if i%50 == 0 {
					v = make([]byte, 256<<10)
				}
				if i%3 == 0 {
					if cn, err := c.Connection(rctx); err == nil {
						_, _ = cn.Set(rctx, fmt.Sprintf("x%d", i), v, sskv.SetOptions{})
					}
					return
				}
				_, _ = c.Set(rctx, fmt.Sprintf("x%d", i), v, sskv.SetOptions{})
			}()
		}
		switch it % 4 {
		case 1:
			p.Blackhole()
		case 2:
			time.AfterFunc(time.Duration(rand.IntN(50))*time.Millisecond, p.Cut)
		case 3:
			time.AfterFunc(time.Duration(rand.IntN(50))*time.Millisecond, func() { _ = srv.Kick(c.ID()) })
		}
		time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
		done := make(chan struct{})
		go func() { _ = c.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("iteration %d: Close hung; publisher %+v", it, sskv.PublisherStateForTest(c))
		}
		cw := make(chan struct{})
		go func() { wg.Wait(); close(cw) }()
		select {
		case <-cw:
		case <-time.After(3 * time.Second):
			t.Fatalf("iteration %d: %d of %d callers still blocked 3s after Close; publisher %+v", it, n-returned.Load(), n, sskv.PublisherStateForTest(c))
		}
		if st := sskv.PublisherStateForTest(c); st.Running || st.Tracked != 0 || st.Queued != 0 {
			t.Errorf("iteration %d: publisher after Close: %+v", it, st)
		}
		p.Heal()
	}
}

// The session expires during partitions (SessionExpiry 1 s), so paho
// clears it on reconnect while requests are queued and in flight, but the
// store keeps its keys: a request told ErrNotSent must not be in the store,
// a request that succeeded must be, every caller returns by its deadline,
// and the publisher ends idle with all its slots.
func TestStressPublisherSessionExpiresDuringPartition(t *testing.T) {
	stressOnly(t)
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 4 << 20})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) {
		cfg.KeepAlive = 2 * time.Second
		cfg.PingTimeout = 300 * time.Millisecond
		cfg.SessionExpiry = time.Second
	})
	ctx, cancel0 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel0()
	o := burst(ctx, c, "e", 8, 40, false, false, func() time.Duration {
		return time.Duration(200+rand.IntN(2500)) * time.Millisecond
	})
	for k := range 3 {
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
		if k%2 == 0 {
			p.Blackhole()
			time.Sleep(1500 * time.Millisecond)
			p.Partition()
			time.Sleep(300 * time.Millisecond)
			p.Heal()
		} else {
			p.Partition()
			time.Sleep(1500 * time.Millisecond)
			p.Heal()
		}
	}
	time.Sleep(300 * time.Millisecond)
	o.halt()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o.check(t, ctx, c)
}
