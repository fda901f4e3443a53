package interop

// TestMixedFleet is the rolling upgrade of docs/migrating.md, on one lock key:
// replicas still on the official SDK's leasedlock.Lock and replicas already on
// dsslock's plain lock.Lock (no FenceKey) take turns, some of them crash while
// they hold (their connection ends without a DISCONNECT and they never
// release, as a process killed with kill -9) and some lose their connection
// for a moment while they hold.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

const (
	// The workers contend for at least mixRun, and then until each side has
	// acquired the lock mixMinAcquired times, but no longer than mixMaxRun.
	// A dsslock worker waits a TTL after each reconnect (its hold-off) and
	// for each crashed holder's key to expire, so its Lock calls take
	// seconds (median 4.5 s in a CI run): mixMaxRun leaves room for that
	// on a loaded machine, where 25 s once gave 7 acquisitions of 8.
	mixRun    = 8 * time.Second
	mixMaxRun = 45 * time.Second
	// mixTTL is the dsslock Locks' TTL and the SDK holders' lease duration.
	mixTTL = time.Second
	// mixWorkers is the number of workers on each side.
	mixWorkers = 3
	// mixMinAcquired is how many acquisitions each side must make at least.
	mixMinAcquired = 8
	// mixSlack absorbs the resolution of the store's versions (whole
	// milliseconds, truncated) when a moment on this process's clock is
	// compared with one (the store runs on this machine, on the same clock).
	mixSlack = 2 * time.Millisecond
	// mixStep is how often a holder notes that it believes it holds.
	mixStep = 5 * time.Millisecond
)

// TestMixedFleet checks, from outside both libraries:
//
//   - the store never has two holders: an observer watches the key, and no
//     SET of one holder's value follows a SET of another's before a DELETE;
//   - no dsslock worker believes it holds outside its key's lifetime: every
//     moment at which it believed it held (it noted the time, then found
//     Lock.FencingToken still valid) lies within the interval, as the store
//     stamped it, in which the key held its HolderID, up to the DELETE or
//     the expiry after the last renewal, whichever came first;
//   - both sides keep making progress: each acquires at least mixMinAcquired
//     times within mixMaxRun, crashes of either side included (each worker's
//     second holding ends in a crash, its third has a stall (fateStall), its
//     fourth a cut connection, and later ones any of these, at random).
//
// An SDK holder has no renew deadline and no way to learn that its key
// expired: after a stall longer than its lease it goes on believing. Such
// moments are counted apart, as the SDK's (logged, not a failure); the same
// check on a dsslock worker fails the test.
func TestMixedFleet(t *testing.T) {
	e := newEnv(t)
	key := e.key("lock")

	obs := e.newObserver(key)

	j := &journal{added: make(chan struct{}, 1)}
	runCtx, stop := context.WithTimeout(e.ctx, mixMaxRun)
	defer stop()
	go func() {
		// Stop once both sides have made progress enough, after mixRun.
		atLeast := time.NewTimer(mixRun)
		defer atLeast.Stop()
		select {
		case <-atLeast.C:
		case <-runCtx.Done():
			return
		}
		for {
			if a := j.acquired(); a[sideDsslock] >= mixMinAcquired && a[sideSDK] >= mixMinAcquired {
				stop()
				return
			}
			select {
			case <-j.added:
			case <-runCtx.Done():
				return
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range mixWorkers {
		dw := &mixWorker{e: e, j: j, key: key, name: fmt.Sprintf("dss%d", i)}
		wg.Go(func() { dw.runDsslock(runCtx) })
		sw := &mixWorker{e: e, j: j, key: key, name: fmt.Sprintf("sdk%d", i)}
		wg.Go(func() { sw.runSDK(runCtx) })
	}
	wg.Wait()
	ran := time.Since(start)
	if t.Failed() {
		return
	}

	// Every holding ends at the store (a release, or the expiry of a crashed
	// holder's key): wait until the observer has seen all of them end, so
	// that its record is complete.
	holdings := j.all()
	ivs, err := obs.waitComplete(e.ctx, holdings)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}

	var acquired [2]int
	owner := make(map[*interval]*holding)
	var sdkOverlaps, sdkOverlapHoldings, sdkOverlapOthers int
	var sdkWorst time.Duration
	dssExpired, dssClosest := 0, time.Duration(math.MaxInt64)
	for _, h := range holdings {
		acquired[h.side]++
		iv := match(ivs, h)
		if iv == nil {
			t.Errorf("%s: holding with token %v never seen at the store by the observer", h, h.token)
			continue
		}
		if o := owner[iv]; o != nil && o.worker != h.worker {
			t.Errorf("%s and %s both took the key while it held %q from %v: two holders (a shared HolderID?)",
				o, h, iv.value, iv.startV)
		}
		owner[iv] = h
		first, last := h.first(), h.last()
		if first.Before(iv.start.Add(-mixSlack)) {
			t.Errorf("%s: believed it held at %s, before the store gave it the key (%s)",
				h, first.Format(time.StampMicro), iv.start.Format(time.StampMicro))
		}
		over := last.Sub(iv.end)
		if h.side == sideDsslock && iv.how == "expired" && h.how != "crashed" {
			dssExpired++
			dssClosest = min(dssClosest, -over)
		}
		if over <= mixSlack {
			continue
		}
		if h.side == sideDsslock {
			t.Errorf("%s: believed it held %v after its key ended at the store (%s at %s; belief points %d, end %s)",
				h, over, iv.how, iv.end.Format(time.StampMicro), len(h.points), h.how)
			continue
		}
		sdkOverlapHoldings++
		if next := nextInterval(ivs, iv); next != nil && next.start.Before(last) {
			sdkOverlapOthers++
		}
		for _, p := range h.points {
			if p.Sub(iv.end) > mixSlack {
				sdkOverlaps++
			}
		}
		sdkWorst = max(sdkWorst, over)
	}

	t.Logf("in %v: acquisitions dsslock %d, SDK %d (crashes: dsslock %d, SDK %d; connection cuts while holding: dsslock %d, SDK %d; stalls while holding: dsslock %d, SDK %d; dsslock holdings lost %d)",
		ran.Round(time.Millisecond), acquired[sideDsslock], acquired[sideSDK], j.crashes[sideDsslock], j.crashes[sideSDK],
		j.cuts[sideDsslock], j.cuts[sideSDK], j.stalls[sideDsslock], j.stalls[sideSDK], j.lost)
	if dssExpired > 0 {
		t.Logf("dsslock holdings whose key expired (not deleted): %d; the closest a belief came to the expiry: %v before it",
			dssExpired, dssClosest)
	}
	t.Logf("SDK holders believing they held after their key ended (the SDK's, not a failure): %d holdings (%d of them while another replica held the key), %d moments, worst %v past the end",
		sdkOverlapHoldings, sdkOverlapOthers, sdkOverlaps, sdkWorst)
	for side := range side2name {
		var ws []time.Duration
		for _, h := range holdings {
			if h.side == side {
				ws = append(ws, h.waited)
			}
		}
		if len(ws) > 0 {
			slices.Sort(ws)
			t.Logf("%s Lock calls: median %v, longest %v", side2name[side], ws[len(ws)/2].Round(time.Millisecond), ws[len(ws)-1].Round(time.Millisecond))
		}
	}
	renewals := 0
	for _, iv := range ivs {
		renewals += len(iv.setVersion) - 1
	}
	t.Logf("observer: %d key intervals, %d renewals, %d notifications", len(ivs), renewals, obs.count())
	for side, n := range acquired {
		if n < mixMinAcquired {
			t.Errorf("%s acquired the lock %d times in %v, want at least %d", side2name[side], n, ran.Round(time.Millisecond), mixMinAcquired)
		}
	}
}

const (
	sideDsslock = 0
	sideSDK     = 1
)

var side2name = [2]string{"dsslock", "SDK"}

// holding is one acquisition by one worker, as the worker saw it.
type holding struct {
	side   int
	worker string
	holder string        // the key's value while it holds
	token  hlc.Timestamp // the version of the SET that took the key
	points []time.Time   // moments at which it believed it held
	how    string        // how it ended
	waited time.Duration // how long its Lock call took
}

func (h *holding) String() string {
	return fmt.Sprintf("%s worker %s (holder %q)", side2name[h.side], h.worker, h.holder)
}

func (h *holding) first() time.Time { return h.points[0] }
func (h *holding) last() time.Time  { return h.points[len(h.points)-1] }

// journal collects the workers' holdings.
type journal struct {
	mu      sync.Mutex
	hs      []*holding
	crashes [2]int
	cuts    [2]int
	stalls  [2]int
	lost    int
	added   chan struct{} // a holding was added
}

func (j *journal) add(h *holding) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.hs = append(j.hs, h)
	switch h.how {
	case "crashed":
		j.crashes[h.side]++
	case "lost":
		j.lost++
	}
	select {
	case j.added <- struct{}{}:
	default:
	}
}

func (j *journal) acquired() [2]int {
	j.mu.Lock()
	defer j.mu.Unlock()
	var n [2]int
	for _, h := range j.hs {
		n[h.side]++
	}
	return n
}

// count adds one to (*what)[side].
func (j *journal) count(what *[2]int, side int) {
	j.mu.Lock()
	what[side]++
	j.mu.Unlock()
}

func (j *journal) all() []*holding {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.hs)
}

// fate is what a worker does with one holding.
type fate int

const (
	fateRelease fate = iota // hold, then release
	fateCut                 // lose the connection while holding, then release
	fateCrash               // crash while holding: never release
	// fateStall is a stall longer than the lease while holding: the holder
	// means to hold 1.5 leases more. An SDK holder, paused, goes on as if it
	// still held (it does not renew); a dsslock holder's network is down for
	// 0.5 to 1.5 TTLs, so that its renewals cannot get through.
	fateStall
)

// pickFate returns the fate of a worker's n-th holding (from 1).
func pickFate(n int) fate {
	switch n {
	case 2:
		return fateCrash
	case 3:
		return fateStall
	case 4:
		return fateCut
	}
	switch r := rand.IntN(20); {
	case r < 2:
		return fateCrash
	case r < 4:
		return fateCut
	case r < 5:
		return fateStall
	default:
		return fateRelease
	}
}

// mixWorker is one replica. Its connection goes through a proxy of its own,
// which cuts it (fateCut), refuses it for a while (fateStall) or shuts it for
// good (fateCrash). A crashed worker
// starts again as a new process would: new proxy, new client, new client id.
type mixWorker struct {
	e    *env
	j    *journal
	key  string
	name string

	proxy *cutProxy
	n     int // holdings so far
}

// holdLoop holds for hold, noting every mixStep that it believes
// it holds while believe says so, and acts out f part way. It returns how
// the holding ended: "released" (the caller releases), "lost" or "crashed"
// (crash has run).
func (w *mixWorker) holdLoop(ctx context.Context, h *holding, hold time.Duration, f fate, believe func() bool, done <-chan struct{}, crash func()) string {
	start := time.Now()
	actAt := start.Add(time.Duration(rand.Int64N(int64(hold))))
	acted := false
	timer := time.NewTimer(mixStep)
	defer timer.Stop()
	for {
		// The moment is taken before the check: if the check passes, the
		// holder still held at that moment.
		now := time.Now()
		if !believe() {
			return "lost"
		}
		h.points = append(h.points, now)
		if !acted && !now.Before(actAt) {
			acted = true
			switch f {
			case fateCrash:
				crash()
				return "crashed"
			case fateCut:
				w.proxy.cut()
				w.j.count(&w.j.cuts, h.side)
			case fateStall:
				w.j.count(&w.j.stalls, h.side)
				hold = now.Sub(start) + 3*mixTTL/2
				if h.side == sideSDK {
					break
				}
				p := w.proxy
				p.setDown(true)
				p.cut()
				time.AfterFunc(randDuration(mixTTL/2, 3*mixTTL/2), func() { p.setDown(false) })
			}
		}
		if now.Sub(start) >= hold || ctx.Err() != nil {
			return "released"
		}
		timer.Reset(mixStep)
		select {
		case <-timer.C:
		case <-done:
		}
	}
}

func (w *mixWorker) fate() fate {
	w.n++
	return pickFate(w.n)
}

// randDuration returns a random duration in [lo, hi).
func randDuration(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rand.Int64N(int64(hi-lo)))
}

// idle waits a little between holdings, as a replica does some other work.
func idle(ctx context.Context) {
	t := time.NewTimer(time.Duration(rand.IntN(30)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (w *mixWorker) runDsslock(ctx context.Context) {
	t := w.e.t
	var (
		c *sskv.Client
		l *lock.Lock
	)
	connect := func() error {
		w.proxy = newCutProxy(storeAddress())
		var err error
		c, err = sskv.Dial(w.e.ctx, sskv.Config{
			Addr:     w.proxy.addr(),
			ClientID: fmt.Sprintf("dsslock-%s-%s", w.name, randHex(4)),
		})
		if err != nil {
			return fmt.Errorf("sskv.Dial: %w", err)
		}
		l, err = lock.New(c, lock.Config{Name: w.key, TTL: mixTTL})
		if err != nil {
			return fmt.Errorf("lock.New: %w", err)
		}
		return nil
	}
	shut := func() {
		if l != nil {
			cctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			_ = l.Close(cctx)
			cancel()
		}
		if c != nil {
			_ = c.Close()
		}
		w.proxy.close()
		c, l = nil, nil
	}
	defer func() {
		if c != nil {
			shut()
		}
	}()

	for ctx.Err() == nil {
		if c == nil {
			if err := connect(); err != nil {
				t.Errorf("dsslock worker %s: %v", w.name, err)
				return
			}
		}
		began := time.Now()
		if err := l.Lock(ctx); err != nil {
			if ctx.Err() == nil {
				t.Errorf("dsslock worker %s: Lock: %v", w.name, err)
			}
			return
		}
		h := &holding{side: sideDsslock, worker: w.name, holder: l.HolderID(), token: l.Token(), waited: time.Since(began)}
		believe := func() bool { _, err := l.FencingToken(); return err == nil }
		crash := func() {
			// As kill -9: the connection ends without a DISCONNECT, and
			// nothing of this process acts again; the key expires.
			w.proxy.close()
			_ = c.Close()
			c, l = nil, nil
		}
		// Most holdings are short; some last longer than the TTL, so that
		// the Lock renews its key while it holds.
		hold := randDuration(20*time.Millisecond, 200*time.Millisecond)
		if rand.IntN(8) == 0 {
			hold = randDuration(mixTTL/3, 3*mixTTL/2)
		}
		h.how = w.holdLoop(ctx, h, hold, w.fate(), believe, l.Done(), crash)
		if len(h.points) == 0 {
			// Lost before its first note (a stall right after Lock).
			h.points = append(h.points, time.Now())
			h.how = "lost before use"
		}
		w.j.add(h)
		if l != nil {
			uctx, cancel := context.WithTimeout(w.e.ctx, waitTimeout)
			// With the connection cut, the outcome of the release may be
			// unknown (the key then expires); the store refusing it is a bug.
			var se *sskv.ServiceError
			if err := l.Unlock(uctx); errors.As(err, &se) {
				t.Errorf("dsslock worker %s: Unlock refused by the store: %v", w.name, err)
			}
			cancel()
		}
		idle(ctx)
	}
}

func (w *mixWorker) runSDK(ctx context.Context) {
	t := w.e.t
	var (
		c  *client
		lk leasedlock.Lock[string, string]
	)
	connect := func() {
		w.proxy = newCutProxy(storeAddress())
		host, port := w.proxy.hostPort()
		c = w.e.newClientAt("mix-"+w.name, host, port)
		lk = leasedlock.NewLock(c.ss, w.key)
	}
	shut := func() {
		c.close()
		w.proxy.close()
		c = nil
	}
	defer func() {
		if c != nil {
			shut()
		}
	}()

	for ctx.Err() == nil {
		if c == nil {
			connect()
		}
		// A waiter gives up after waitTimeout and tries again: the SDK's
		// Lock would otherwise wait forever for a DELETE it missed.
		began := time.Now()
		err := lk.Lock(ctx, mixTTL, leasedlock.WithTimeout(waitTimeout))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Logf("SDK worker %s: Lock waited %v without a DELETE; trying again", w.name, waitTimeout)
				continue
			}
			t.Errorf("SDK worker %s: Lock: %v", w.name, err)
			return
		}
		tok, err := lk.Token(w.e.ctx)
		if err != nil {
			t.Errorf("SDK worker %s: Token after Lock: %v", w.name, err)
			return
		}
		token, err := hlc.Parse(tok.String())
		if err != nil {
			t.Errorf("SDK worker %s: token %q: %v", w.name, tok.String(), err)
			return
		}
		h := &holding{side: sideSDK, worker: w.name, holder: c.id, token: token, waited: time.Since(began)}
		crash := func() {
			// As kill -9: the connection ends without a DISCONNECT, and
			// nothing of this process acts again; the key expires.
			w.proxy.close()
			_ = c.mqtt.Stop()
			c.close()
			c = nil
		}
		// The SDK holder believes it holds until it releases: nothing tells
		// it otherwise.
		// It holds for well under its lease, as an SDK user must, since it
		// does not renew.
		hold := randDuration(20*time.Millisecond, 200*time.Millisecond)
		h.how = w.holdLoop(ctx, h, hold, w.fate(), func() bool { return true }, nil, crash)
		w.j.add(h)
		if c != nil {
			uctx, cancel := context.WithTimeout(w.e.ctx, waitTimeout)
			if err := lk.Unlock(uctx); err != nil {
				t.Logf("SDK worker %s: Unlock: %v", w.name, err)
			}
			cancel()
		}
		idle(ctx)
	}
}

// ---- the observer: the key's history as the store stamped it ----

// observer records every notification of the key. The SDK delivers each
// notification on a goroutine of its own, so they may arrive out of order:
// they are put back in order by version, which the store gives each event
// of the key in the order it applies them (an expiry included).
type observer struct {
	e       *env
	key     string
	mu      sync.Mutex
	events  []notification
	changed chan struct{}
}

func (e *env) newObserver(key string) *observer {
	e.t.Helper()
	c := e.newClient("observer")
	o := &observer{e: e, key: key, changed: make(chan struct{}, 1)}
	q := e.watch(c, key)
	if err := c.ss.KeyNotify(e.ctx, key); err != nil {
		e.t.Fatalf("observer KeyNotify: %v", err)
	}
	if g, err := c.ss.Get(e.ctx, key); err != nil || !g.Version.IsZero() {
		e.t.Fatalf("observer: Get of the fresh key = %+v, %v; want a miss", g, err)
	}
	go func() {
		for n := range q.ch {
			o.mu.Lock()
			o.events = append(o.events, n)
			o.mu.Unlock()
			select {
			case o.changed <- struct{}{}:
			default:
			}
		}
	}()
	return o
}

func (o *observer) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events)
}

// interval is one stretch of time during which the key held one value.
type interval struct {
	value      string
	start      time.Time     // the version of the SET that created the key
	startV     hlc.Timestamp // the same, as a version
	lastSetV   hlc.Timestamp // the last SET of the value (a renewal, or start)
	end        time.Time     // min(the DELETE's version, last SET + mixTTL); zero while open
	how        string        // "deleted" or "expired"
	closed     bool
	setVersion []hlc.Timestamp
}

// intervals rebuilds the key's history. A SET of another value while the key
// exists is the store having two holders: an error.
func (o *observer) intervals() ([]*interval, error) {
	o.mu.Lock()
	evs := slices.Clone(o.events)
	o.mu.Unlock()

	type ev struct {
		op, value string
		v         hlc.Timestamp
	}
	list := make([]ev, 0, len(evs))
	for _, n := range evs {
		v, err := hlc.Parse(n.Version.String())
		if err != nil {
			return nil, fmt.Errorf("notification version %q: %v", n.Version.String(), err)
		}
		list = append(list, ev{n.Operation, n.Value, v})
	}
	slices.SortFunc(list, func(a, b ev) int { return a.v.Compare(b.v) })

	var ivs []*interval
	var cur *interval
	for _, x := range list {
		switch x.op {
		case "SET":
			if cur == nil {
				cur = &interval{value: x.value, start: x.v.Time(), startV: x.v, lastSetV: x.v}
				cur.setVersion = append(cur.setVersion, x.v)
				ivs = append(ivs, cur)
				continue
			}
			if x.value != cur.value {
				return nil, fmt.Errorf("two holders: the key held %q (since %v) when the store set it to %q (at %v) without a DELETE between",
					cur.value, cur.startV, x.value, x.v)
			}
			cur.lastSetV = x.v
			cur.setVersion = append(cur.setVersion, x.v)
		case "DELETE":
			if cur == nil {
				return nil, fmt.Errorf("DELETE at %v of a key that did not exist", x.v)
			}
			cur.end, cur.how = x.v.Time(), "deleted"
			if exp := cur.lastSetV.Time().Add(mixTTL); exp.Before(cur.end) {
				cur.end, cur.how = exp, "expired"
			}
			cur.closed = true
			cur = nil
		default:
			return nil, fmt.Errorf("notification %q", x.op)
		}
	}
	return ivs, nil
}

// match finds the interval of h: the key held h's value, and h's token is
// one of the versions the store gave it then.
func match(ivs []*interval, h *holding) *interval {
	for _, iv := range ivs {
		if iv.value == h.holder && slices.Contains(iv.setVersion, h.token) {
			return iv
		}
	}
	return nil
}

// nextInterval returns the interval after iv, or nil.
func nextInterval(ivs []*interval, iv *interval) *interval {
	if i := slices.Index(ivs, iv); i >= 0 && i+1 < len(ivs) {
		return ivs[i+1]
	}
	return nil
}

// waitComplete waits until every holding's interval has been seen to end,
// and returns the key's history.
func (o *observer) waitComplete(ctx context.Context, hs []*holding) ([]*interval, error) {
	// A crashed holder's key expires mixTTL after its last renewal.
	ctx, cancel := context.WithTimeout(ctx, mixTTL+waitTimeout)
	defer cancel()
	for {
		ivs, err := o.intervals()
		if err != nil {
			return nil, err
		}
		missing := 0
		for _, h := range hs {
			if iv := match(ivs, h); iv == nil || !iv.closed {
				missing++
			}
		}
		open := len(ivs) > 0 && !ivs[len(ivs)-1].closed
		if missing == 0 && !open {
			return ivs, nil
		}
		select {
		case <-o.changed:
		case <-ctx.Done():
			var b strings.Builder
			for _, iv := range ivs[max(0, len(ivs)-5):] {
				fmt.Fprintf(&b, "\n  %q from %v, closed %v", iv.value, iv.startV, iv.closed)
			}
			return nil, fmt.Errorf("%d of %d holdings not seen to end at the store (open interval: %v) within %v; last intervals:%s",
				missing, len(hs), open, mixTTL+waitTimeout, b.String())
		}
	}
}

// ---- a proxy whose connections can be cut ----

// cutProxy forwards TCP connections to the store. cut ends the current ones
// (the client reconnects through it); close ends them and stops listening,
// so that the client cannot come back: to the store, this is a process
// killed with kill -9 (its connection ends without a DISCONNECT).
type cutProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	down   bool // new connections are closed at once
	wg     sync.WaitGroup
}

func newCutProxy(target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("proxy listen: %v", err)) // loopback: cannot fail in practice
	}
	p := &cutProxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Go(p.serve)
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) hostPort() (string, uint16) {
	host, port, _ := net.SplitHostPort(p.addr())
	n, _ := strconv.ParseUint(port, 10, 16)
	return host, uint16(n)
}

func (p *cutProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, waitTimeout)
		if err != nil {
			in.Close()
			continue
		}
		if !p.track(in, out) {
			in.Close()
			out.Close()
			return
		}
		for _, d := range [][2]net.Conn{{in, out}, {out, in}} {
			p.wg.Go(func() {
				_, _ = io.Copy(d[0], d[1])
				p.drop(d[0], d[1])
			})
		}
	}
}

func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *cutProxy) drop(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

// cut ends every connection through the proxy; it goes on listening.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// setDown makes the proxy close every new connection at once (true), as
// a store that is away, or forward them again (false).
func (p *cutProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	p.mu.Unlock()
}

// close stops listening, ends every connection and waits for its goroutines.
func (p *cutProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.cut()
	p.wg.Wait()
}

// TestPlainRelockLeavesKeyUnfenced: a plain lock.Lock (no FenceKey) whose
// release could not reach the store (its connection was lost) leaves its
// HolderID on the key until it expires. Locking again meanwhile must not
// fence the key: an SDK replica's leasedlock would then get "a fencing token
// is required" instead of false, and the Lock's own Unlock (an unfenced VDEL)
// would be refused, leaving every later holder to wait for the expiry.
// TestMixedFleet ran into this.
func TestPlainRelockLeavesKeyUnfenced(t *testing.T) {
	e := newEnv(t)
	key := e.key("lock")
	p := newCutProxy(storeAddress())
	defer p.close()
	c, err := sskv.Dial(e.ctx, sskv.Config{Addr: p.addr()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := e.ourLock(c, lock.Config{Name: key, TTL: mixTTL})
	if err := l.Lock(e.ctx); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	p.setDown(true)
	p.cut()
	if err := l.Unlock(e.ctx); !errors.Is(err, lock.ErrNotReleased) {
		t.Fatalf("Unlock with the store away = %v, want ErrNotReleased", err)
	}
	p.setDown(false)
	if err := l.Lock(e.ctx); err != nil {
		t.Fatalf("Lock again: %v", err)
	}

	s := e.newClient("sdk")
	if ok, err := leasedlock.NewLease(s.ss, key).Acquire(e.ctx, mixTTL); ok || err != nil {
		t.Errorf("SDK Acquire while the Lock holds again = %v, %v; want false, nil (the key must stay unfenced)", ok, err)
	}
	if err := l.Unlock(e.ctx); err != nil {
		t.Errorf("Unlock after locking again: %v", err)
	}
	if g, err := s.ss.Get(e.ctx, key); err != nil || !g.Version.IsZero() {
		t.Errorf("key after Unlock = %q (version %v), %v; want it deleted", g.Value, g.Version, err)
	}
}

// TestHolderIDRule shows why docs/migrating.md forbids a dsslock HolderID
// equal to an SDK holder's name (its client id): SET NEX lets whoever writes
// the value already there "renew" the key, so the SDK replica takes a key
// the dsslock Lock holds, and both believe they hold it.
func TestHolderIDRule(t *testing.T) {
	e := newEnv(t)
	key := e.key("lock")
	s := e.newClient("sdk")
	l := e.ourLock(e.ourClient("rule"), lock.Config{Name: key, TTL: 10 * time.Second, HolderID: s.id})
	if err := l.Lock(e.ctx); err != nil {
		t.Fatalf("Lock: %v", err)
	}
	ok, err := leasedlock.NewLease(s.ss, key).Acquire(e.ctx, 10*time.Second)
	if err != nil || !ok {
		t.Fatalf("SDK Acquire while a dsslock Lock with the SDK's name holds = %v, %v; want true (the rule's reason)", ok, err)
	}
	if _, err := l.FencingToken(); err != nil {
		t.Fatalf("the dsslock Lock no longer holds: %v", err)
	}
}
