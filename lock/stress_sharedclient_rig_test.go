package lock_test

// The mixed-fault stress rigs (stress_faults_test.go) with contenders
// sharing clients, so that one stuck writer delays several holdings: run
// with DSSLOCK_STRESS=1.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// runSharedClientRig is runAdvRig(Sem) with the contenders sharing clients:
// nClients proxied clients (small socket buffers), perClient contenders on
// each, plus background holdings of other keys on every client, and a fault
// that freezes a client's path with its writer stuck on a large SET.
func runSharedClientRig(t *testing.T, cfg lock.Config, semCfg lock.SemaphoreConfig, nClients, perClient, background int, d time.Duration, seed uint64, restarts bool) {
	srv := startStore(t)
	r := &advRig{t: t, srv: srv, cfg: cfg, semCfg: semCfg, admin: dial(t, srv.Addr()), restarts: restarts}
	var ps []*faultproxy.Proxy
	var cs []*sskv.Client
	for range nClients {
		p, err := faultproxy.Start(srv.Addr(), faultproxy.Options{BufferSize: 32 << 10})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		c := dial(t, p.Addr())
		ps, cs = append(ps, p), append(cs, c)
		for b := range background {
			bc := lock.Config{Name: fmt.Sprintf("bg-%s-%d", c.ID(), b), TTL: cfg.TTL, FenceKey: b%2 == 0}
			if bc.TTL == 0 {
				bc.TTL = semCfg.TTL
			}
			bl := newLock(t, c, bc)
			go func() { _ = bl.Lock(testCtx(t)) }()
		}
	}
	for i := range nClients * perClient {
		k := i % nClients
		r.addContender(i, cs[k], ps[k])
	}
	// The stuck-writer fault.
	stuck := func(ctx context.Context) {
		rng := rand.New(rand.NewPCG(seed+1, seed))
		big := []byte(strings.Repeat("x", 1<<20))
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(1000+rng.IntN(2000)) * time.Millisecond):
			}
			k := rng.IntN(nClients)
			ps[k].Blackhole()
			sctx, scancel := context.WithTimeout(ctx, time.Duration(100+rng.IntN(2000))*time.Millisecond)
			go func() { defer scancel(); _, _ = cs[k].Set(sctx, "big", big, sskv.SetOptions{}) }()
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(rng.IntN(2000)) * time.Millisecond):
			}
			ps[k].Heal()
		}
	}
	if sharedStuckOnly {
		r.run(d, seed, stuck)
		return
	}
	r.run(d, seed, stuck, func(ctx context.Context) { r.faults(ctx, rand.New(rand.NewPCG(seed, seed))) })
}

// sharedStuckOnly leaves only the stuck-writer fault (set by
// TestStressSharedClientStuckOnly).
var sharedStuckOnly bool

// TestStressSharedClientStuckOnly: the stuck-writer fault alone.
func TestStressSharedClientStuckOnly(t *testing.T) {
	stressOnly(t)
	sharedStuckOnly = true
	defer func() { sharedStuckOnly = false }()
	for _, tc := range []struct {
		name string
		cfg  lock.Config
	}{
		{"plain", lock.Config{Name: "l", TTL: time.Second}},
		{"FenceKey", lock.Config{Name: "l", TTL: time.Second, FenceKey: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runSharedClientRig(t, tc.cfg, lock.SemaphoreConfig{}, 2, 3, 8, 12*time.Second, seed, false)
		})
	}
}

func TestStressSharedClientStress(t *testing.T) {
	stressOnly(t)
	for _, tc := range []struct {
		name     string
		cfg      lock.Config
		restarts bool
	}{
		{"plain", lock.Config{Name: "l", TTL: time.Second}, false},
		{"FenceKey", lock.Config{Name: "l", TTL: time.Second, FenceKey: true}, false},
		{"Race", lock.Config{Name: "l", TTL: time.Second, Race: true}, false},
		{"plain/restarts", lock.Config{Name: "l", TTL: time.Second}, true},
		{"FenceKey/restarts", lock.Config{Name: "l", TTL: time.Second, FenceKey: true}, true},
		{"tight", lock.Config{Name: "l", TTL: time.Second, RenewInterval: 700 * time.Millisecond, RenewDeadline: 900 * time.Millisecond}, false},
		{"FenceKey/tight/restarts", lock.Config{Name: "l", TTL: time.Second, RenewInterval: 700 * time.Millisecond, RenewDeadline: 900 * time.Millisecond, FenceKey: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runSharedClientRig(t, tc.cfg, lock.SemaphoreConfig{}, 2, 3, 8, 12*time.Second, seed, tc.restarts)
		})
	}
}

func TestStressSharedClientSemaphoreStress(t *testing.T) {
	stressOnly(t)
	for _, restarts := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarts=%v", restarts), func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			runSharedClientRig(t, lock.Config{}, lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: time.Second}, 2, 3, 8, 12*time.Second, seed, restarts)
		})
	}
}
