package lock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// acquireHolder is advRig.holder with lock.Acquire in place of Lock.Lock:
// a new Lock for each holding.
func (r *advRig) acquireHolder(ctx context.Context, i int) {
	c := r.clients[i]
	cfg := r.cfg
	cfg.HolderID = fmt.Sprintf("h%d", i)
	for ctx.Err() == nil {
		restarts := r.restarted.Load()
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := lock.Acquire(lctx, c, cfg)
		cancel()
		if err != nil {
			continue
		}
		w := fenced.New(c, l)
		start := time.Now()
		token := l.Token()
		hctx := l.Context()
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		res, gerr := r.admin.Get(gctx, r.cfg.Name)
		gcancel()
		if gerr == nil && hctx.Err() == nil && r.restarted.Load() == restarts && restarts%2 == 0 {
			h := lock.ParseHolder(res.Value, res.Version)
			if h.ID != l.HolderID() || (r.cfg.FenceKey && h.Token != token) {
				if hctx.Err() == nil {
					r.problem("%s: Acquire returned (token %v) but the key holds %q token %v version %v", l.HolderID(), token, h.ID, h.Token, h.Version)
				}
			}
		}
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
		r.mu.Lock()
		r.intervals = append(r.intervals, advInterval{who: l.HolderID(), token: token, start: start, end: end})
		r.acquired++
		r.mu.Unlock()
		uctx, ucancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = l.Unlock(uctx)
		_ = l.Close(uctx)
		ucancel()
		time.Sleep(time.Duration(rand.N(10)) * time.Millisecond) // pacing, not a signal
	}
}

// runAcquire is advRig.run with acquireHolder.
func (r *advRig) runAcquire(d time.Duration, seed uint64, faults ...func(ctx context.Context)) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for i := range r.clients {
		wg.Go(func() { r.acquireHolder(ctx, i) })
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

// Acquire (Race, with and without FenceKey) under the mixed faults, with
// contenders sharing clients (so their waits share a rechecks heap), and
// with store restarts.
func TestStressAcquireMixedFaults(t *testing.T) {
	stressOnly(t)
	for _, tc := range []struct {
		name     string
		cfg      lock.Config
		restarts bool
	}{
		{"Race", lock.Config{Name: "l", TTL: time.Second, Race: true}, false},
		{"Race+FenceKey", lock.Config{Name: "l", TTL: time.Second, Race: true, FenceKey: true}, false},
		{"Race+FenceKey+restarts", lock.Config{Name: "l", TTL: time.Second, Race: true, FenceKey: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			srv := startStore(t)
			r := &advRig{t: t, srv: srv, cfg: tc.cfg, admin: dial(t, srv.Addr()), restarts: tc.restarts}
			for range 2 {
				p := startProxy(t, srv.Addr())
				c := dial(t, p.Addr())
				for range 3 {
					r.proxies = append(r.proxies, p)
					r.clients = append(r.clients, c)
				}
			}
			r.runAcquire(10*time.Second, seed, func(ctx context.Context) { r.faults(ctx, rand.New(rand.NewPCG(seed, seed))) })
		})
	}
}
