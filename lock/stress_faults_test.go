package lock_test

// Stress tests: mixed faults, at random moments, while Locks (and a
// Semaphore's participants) hand a key over to each other, checked against
// the package's guarantees. They take minutes, so they run only when
// DSSLOCK_STRESS is set:
//
//	DSSLOCK_STRESS=1 go test -race -run TestStress -v ./lock/ ./leader/

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// advInterval is one holding as its holder saw it: from Lock's return to
// the end of its Context (or its Unlock).
type advInterval struct {
	who        string
	slot       int
	token      hlc.Timestamp
	start, end time.Time
}

type advRig struct {
	t        testing.TB
	restarts bool // the faults include store restarts
	// restarted counts the restarts begun and ended (odd while one is
	// under way): a key read after one may be gone with the store, before
	// its holder can know.
	restarted atomic.Int64
	srvMu     sync.Mutex
	srv       *localstore.Server
	cfg       lock.Config
	clients   []*sskv.Client
	proxies   []*faultproxy.Proxy
	locks     []*lock.Lock
	// acquire: each holding is a new Lock of lock.Acquire (cfg, with
	// HolderID "h<i>"), not a Lock call of locks[i].
	acquire bool
	sems    []*lock.Semaphore
	semCfg  lock.SemaphoreConfig
	admin   *sskv.Client

	mu        sync.Mutex
	intervals []advInterval
	lastWrite hlc.Timestamp
	acquired  int
	problems  []string
}

func (r *advRig) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// holder runs Lock i in a loop until ctx ends: lock, check the key, write
// fenced, hold a little, unlock.
func (r *advRig) holder(ctx context.Context, i int) {
	c := r.clients[i]
	lockOnce := func(ctx context.Context) (*lock.Lock, error) {
		if r.acquire {
			cfg := r.cfg
			cfg.HolderID = fmt.Sprintf("h%d", i)
			return lock.Acquire(ctx, c, cfg)
		}
		return r.locks[i], r.locks[i].Lock(ctx)
	}
	for ctx.Err() == nil {
		restarts := r.restarted.Load()
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := lockOnce(lctx)
		cancel()
		if err != nil {
			continue
		}
		w := fenced.New(c, l)
		start := time.Now()
		token := l.Token()
		hctx := l.Context()
		// Never "held" without holding: a read right after must find this
		// holder's record, unless the holding ended meanwhile.
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		res, gerr := r.admin.Get(gctx, r.cfg.Name)
		gcancel()
		if gerr == nil && hctx.Err() == nil && r.restarted.Load() == restarts && restarts%2 == 0 {
			h := lock.ParseHolder(res.Value, res.Version)
			if h.ID != l.HolderID() || (r.cfg.FenceKey && h.Token != token) {
				// The read may have been answered after a loss that has not
				// ended the holding yet: only count it if still live after.
				if hctx.Err() == nil {
					r.problem("%s: Lock returned (token %v) but the key holds %q token %v version %v", l.HolderID(), token, h.ID, h.Token, h.Version)
				}
			}
		}
		// A fenced write, tokens in order.
		wctx, wcancel := context.WithTimeout(hctx, time.Second)
		_, werr := w.Set(wctx, "data", []byte(l.HolderID()), sskv.SetOptions{})
		wcancel()
		if werr == nil {
			r.mu.Lock()
			if token.Before(r.lastWrite) {
				r.problems = append(r.problems, fmt.Sprintf("%s: fenced write with token %v accepted after one with %v", l.HolderID(), token, r.lastWrite))
			}
			if token.After(r.lastWrite) {
				r.lastWrite = token
			}
			r.mu.Unlock()
		}
		select {
		case <-hctx.Done():
		case <-time.After(time.Duration(rand.N(40)) * time.Millisecond):
		case <-ctx.Done():
		}
		end := time.Now()
		if hctx.Err() != nil {
			// The holding ended on its own: when it did is Done's time,
			// which we approximate by now (it can only be earlier).
			end = time.Now()
		}
		r.mu.Lock()
		r.intervals = append(r.intervals, advInterval{who: l.HolderID(), token: token, start: start, end: end})
		r.acquired++
		r.mu.Unlock()
		uctx, ucancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = l.Unlock(uctx)
		if r.acquire {
			_ = l.Close(uctx)
		}
		ucancel()
		time.Sleep(time.Duration(rand.N(10)) * time.Millisecond)
	}
}

func (r *advRig) faults(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond):
		}
		i := rng.IntN(len(r.clients))
		id := r.clients[i].ID()
		r.srvMu.Lock()
		srv := r.srv
		r.srvMu.Unlock()
		kinds := 7
		if r.restarts {
			kinds = 9
		}
		switch rng.IntN(kinds) {
		case 7, 8:
			if !r.restart(time.Duration(rng.IntN(300)) * time.Millisecond) {
				return
			}
		case 0:
			_ = srv.Kick(id)
		case 1:
			_ = srv.Drop(id)
		case 2:
			d := []localstore.Direction{localstore.ToStore, localstore.FromStore, localstore.Both}[rng.IntN(3)]
			if srv.Hold(id, d) == nil {
				hold := time.Duration(rng.IntN(1500)) * time.Millisecond
				go func() {
					select {
					case <-time.After(hold):
					case <-ctx.Done():
					}
					srv.Release(id)
				}()
			}
		case 3:
			delay := time.Duration(rng.IntN(900)) * time.Millisecond
			srv.SetResponseFault(id, localstore.ResponseFault{Delay: delay})
			lasts := time.Duration(rng.IntN(1500)) * time.Millisecond
			go func() {
				select {
				case <-time.After(lasts):
				case <-ctx.Done():
				}
				srv.SetResponseFault(id, localstore.ResponseFault{})
			}()
		case 4:
			p := r.proxies[i]
			p.Blackhole()
			heal := time.Duration(rng.IntN(1500)) * time.Millisecond
			go func() {
				select {
				case <-time.After(heal):
				case <-ctx.Done():
				}
				p.Heal()
			}()
		case 5:
			r.proxies[i].Cut()
		case 6:
			p := r.proxies[i]
			p.SetDelay(time.Duration(rng.IntN(300)) * time.Millisecond)
			lasts := time.Duration(rng.IntN(1500)) * time.Millisecond
			go func() {
				select {
				case <-time.After(lasts):
				case <-ctx.Done():
				}
				p.SetDelay(0)
			}()
		}
	}
}

// restart stops the store and starts it again on the same address after
// down, losing every key; it reports whether the store is back.
func (r *advRig) restart(down time.Duration) bool {
	r.srvMu.Lock()
	srv := r.srv
	r.srvMu.Unlock()
	addr := srv.Addr()
	r.restarted.Add(1)
	_ = srv.Close()
	time.Sleep(down)
	next, err := localstore.Start(localstore.Config{Addr: addr})
	if err != nil {
		r.problem("restarting the store: %v", err)
		return false
	}
	r.restarted.Add(1)
	r.srvMu.Lock()
	r.srv = next
	r.srvMu.Unlock()
	r.t.Cleanup(func() { _ = next.Close() })
	return true
}

// check reports every pair of holdings that overlapped by more than slack
// on the holders' common clock.
func (r *advRig) check(slack time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	iv := r.intervals
	sort.Slice(iv, func(a, b int) bool { return iv[a].start.Before(iv[b].start) })
	for a := range iv {
		for b := a + 1; b < len(iv); b++ {
			if !iv[b].start.Before(iv[a].end) {
				break
			}
			if ov := iv[a].end.Sub(iv[b].start); ov > slack && iv[a].who != iv[b].who && iv[a].slot == iv[b].slot {
				r.problems = append(r.problems, fmt.Sprintf("holdings overlapped by %v: %s (token %v, %v..%v) and %s (token %v, from %v)",
					ov, iv[a].who, iv[a].token, iv[a].start.Format("15:04:05.000"), iv[a].end.Format("15:04:05.000"),
					iv[b].who, iv[b].token, iv[b].start.Format("15:04:05.000")))
			}
		}
	}
	// At most Limit holdings at once.
	if lim := r.semCfg.Limit; lim > 0 {
		for a := range iv {
			n := 0
			for b := range iv {
				if !iv[b].start.After(iv[a].start) && iv[b].end.Sub(iv[a].start) > slack {
					n++
				}
			}
			if n > lim {
				r.problems = append(r.problems, fmt.Sprintf("%d holdings at once (limit %d) at %v", n, lim, iv[a].start.Format("15:04:05.000")))
			}
		}
	}
	for _, p := range r.problems {
		r.t.Error(p)
	}
}

func runAdvRig(t *testing.T, cfg lock.Config, n int, d time.Duration, seed uint64, restarts bool) {
	runAdvRigSem(t, cfg, lock.SemaphoreConfig{}, n, d, seed, restarts)
}

func runAdvRigSem(t *testing.T, cfg lock.Config, semCfg lock.SemaphoreConfig, n int, d time.Duration, seed uint64, restarts bool) {
	srv := startStore(t)
	r := &advRig{t: t, srv: srv, cfg: cfg, semCfg: semCfg, admin: dial(t, srv.Addr()), restarts: restarts}
	for i := range n {
		p := startProxy(t, srv.Addr())
		r.addContender(i, dial(t, p.Addr()), p)
	}
	r.run(d, seed, func(ctx context.Context) { r.faults(ctx, rand.New(rand.NewPCG(seed, seed))) })
}

// addContender adds contender i, on client c behind proxy p: a participant
// of the rig's Semaphore, if it has one, or else a Lock.
func (r *advRig) addContender(i int, c *sskv.Client, p *faultproxy.Proxy) {
	r.proxies = append(r.proxies, p)
	r.clients = append(r.clients, c)
	if r.semCfg.Limit > 0 {
		sc := r.semCfg
		sc.HolderID = fmt.Sprintf("h%d", i)
		r.sems = append(r.sems, newSemaphore(r.t, c, sc))
	} else {
		lc := r.cfg
		lc.HolderID = fmt.Sprintf("h%d", i)
		r.locks = append(r.locks, newLock(r.t, c, lc))
	}
}

// run has the contenders contend for d, with each of faults running beside
// them until then; then it lifts every fault and checks.
func (r *advRig) run(d time.Duration, seed uint64, faults ...func(ctx context.Context)) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for i := range r.clients {
		if r.semCfg.Limit > 0 {
			wg.Go(func() { r.semHolder(ctx, i) })
		} else {
			wg.Go(func() { r.holder(ctx, i) })
		}
	}
	for _, f := range faults {
		wg.Go(func() { f(ctx) })
	}
	wg.Wait()
	r.srvMu.Lock()
	srv := r.srv
	r.srvMu.Unlock()
	for i, c := range r.clients {
		srv.Release(c.ID())
		r.proxies[i].Heal()
		r.proxies[i].SetDelay(0)
		srv.SetResponseFault(c.ID(), localstore.ResponseFault{})
	}
	r.t.Logf("seed %d: %d holdings, last token %v", seed, r.acquired, r.lastWrite)
	r.check(20 * time.Millisecond)
}

// TestStressMixedFaults: Locks on their own proxied clients contend for one
// key while connections are kicked, dropped, frozen, delayed and cut, and
// responses delayed. No two holdings may overlap in time (beyond a
// scheduling slack), every Lock that returns must find its own record in
// the key, and fenced writes must be accepted in token order.
func TestStressMixedFaults(t *testing.T) {
	stressOnly(t)
	for _, tc := range []struct {
		name string
		cfg  lock.Config
	}{
		{"plain", lock.Config{Name: "l", TTL: time.Second}},
		{"FenceKey", lock.Config{Name: "l", TTL: time.Second, FenceKey: true}},
		{"Race", lock.Config{Name: "l", TTL: time.Second, Race: true}},
		{"Race+FenceKey", lock.Config{Name: "l", TTL: time.Second, Race: true, FenceKey: true}}, // package leader's
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runAdvRig(t, tc.cfg, 4, 12*time.Second, seed, false)
		})
	}
}

// TestStressMixedFaultsWithRestarts: as TestStressMixedFaults, with store
// restarts (every key lost) among the faults. All clients connected before
// the first restart, so every acquisition after one holds off a TTL.
func TestStressMixedFaultsWithRestarts(t *testing.T) {
	stressOnly(t)
	for _, tc := range []struct {
		name string
		cfg  lock.Config
	}{
		{"plain", lock.Config{Name: "l", TTL: time.Second}},
		{"FenceKey", lock.Config{Name: "l", TTL: time.Second, FenceKey: true}},
		{"Race", lock.Config{Name: "l", TTL: time.Second, Race: true}},
		{"Race+FenceKey", lock.Config{Name: "l", TTL: time.Second, Race: true, FenceKey: true}}, // package leader's
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runAdvRig(t, tc.cfg, 4, 15*time.Second, seed, true)
		})
	}
}

// semHolder runs Semaphore i in a loop until ctx ends.
func (r *advRig) semHolder(ctx context.Context, i int) {
	s := r.sems[i]
	c := r.clients[i]
	w := fenced.New(c, s)
	for ctx.Err() == nil {
		restarts := r.restarted.Load()
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.Acquire(actx)
		cancel()
		if err != nil {
			continue
		}
		start := time.Now()
		token, slot := s.Token(), s.Slot()
		hctx := s.Context()
		key := lock.SemaphoreSlot(r.semCfg.Name, slot)
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		res, gerr := r.admin.Get(gctx, key)
		gcancel()
		if gerr == nil && hctx.Err() == nil && r.restarted.Load() == restarts && restarts%2 == 0 {
			h := lock.ParseHolder(res.Value, res.Version)
			if (h.ID != s.HolderID() || h.Token != token) && hctx.Err() == nil {
				r.problem("%s: Acquire returned slot %d (token %v) but the key holds %q token %v version %v", s.HolderID(), slot, token, h.ID, h.Token, h.Version)
			}
		}
		wctx, wcancel := context.WithTimeout(hctx, time.Second)
		_, _ = w.Set(wctx, fmt.Sprintf("data%d", slot), []byte(s.HolderID()), sskv.SetOptions{})
		wcancel()
		select {
		case <-hctx.Done():
		case <-time.After(time.Duration(rand.N(40)) * time.Millisecond):
		case <-ctx.Done():
		}
		end := time.Now()
		r.mu.Lock()
		r.intervals = append(r.intervals, advInterval{who: s.HolderID(), slot: slot, token: token, start: start, end: end})
		r.acquired++
		r.mu.Unlock()
		uctx, ucancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.Release(uctx)
		ucancel()
		time.Sleep(time.Duration(rand.N(10)) * time.Millisecond)
	}
}

// TestStressSemaphoreMixedFaults: participants of a semaphore of 2, on their
// own proxied clients, under the faults of TestAdvMixedFaults, with and
// without store restarts: never two holders of a slot, never more than
// the limit, and a participant whose Acquire returns finds its own record
// in its slot.
func TestStressSemaphoreMixedFaults(t *testing.T) {
	stressOnly(t)
	for _, restarts := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarts=%v", restarts), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runAdvRigSem(t, lock.Config{}, lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: time.Second}, 5, 15*time.Second, seed, restarts)
		})
	}
}

// stressOnly skips t unless DSSLOCK_STRESS is set.
func stressOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("DSSLOCK_STRESS") == "" {
		t.Skip("a stress test: set DSSLOCK_STRESS=1 to run it")
	}
}
