package lock_test

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// faultKinds are the faults BenchmarkHoldingsUnderFaults applies, one kind
// at a time.
var faultKinds = []string{"none", "kick", "drop", "hold", "slow-answers", "blackhole", "cut", "delay", "restart"}

// BenchmarkHoldingsUnderFaults: four Locks (or participants of a
// Semaphore of 2) on their own clients, each behind a fault proxy, take
// turns holding one key (TTL 1 s), each calling Lock again after a short
// hold, while one kind of fault hits one of them at random every 300-600
// ms (or the store restarts, every 1.5-1.8 s). Reported: holdings per
// second. It shows how much of the lock's throughput each fault costs, for
// each kind of waiting: a drop far below the other modes' is a waiter that
// sits on a turn it cannot take. The holdings are checked as the stress
// tests check them (never two at once). Run it with -benchtime=1x;
// DSSLOCK_FAULT_WINDOW sets how long each runs (default 4s).
//
//	go test -run '^$' -bench HoldingsUnderFaults -benchtime=1x ./lock/
func BenchmarkHoldingsUnderFaults(b *testing.B) {
	window := 4 * time.Second
	if v := os.Getenv("DSSLOCK_FAULT_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("DSSLOCK_FAULT_WINDOW=%q: %v", v, err)
		}
		window = d
	}
	modes := []struct {
		name string
		cfg  lock.Config
		sem  lock.SemaphoreConfig
	}{
		{name: "plain", cfg: lock.Config{Name: "l", TTL: time.Second}},
		{name: "FenceKey", cfg: lock.Config{Name: "l", TTL: time.Second, FenceKey: true}},
		{name: "Race", cfg: lock.Config{Name: "l", TTL: time.Second, FenceKey: true, Race: true}},
		{name: "Semaphore2", sem: lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: time.Second}},
	}
	for _, m := range modes {
		for _, kind := range faultKinds {
			b.Run(m.name+"/"+kind, func(b *testing.B) {
				holdings := 0
				for range b.N {
					srv := startStore(b)
					r := &advRig{t: b, srv: srv, cfg: m.cfg, semCfg: m.sem, admin: dial(b, srv.Addr()), restarts: kind == "restart"}
					for i := range 4 {
						p := startProxy(b, srv.Addr())
						r.addContender(i, dial(b, p.Addr()), p)
					}
					rng := rand.New(rand.NewPCG(1, 2))
					r.run(window, 1, func(ctx context.Context) { r.oneFault(ctx, rng, kind) })
					holdings += r.acquired
				}
				b.ReportMetric(float64(holdings)/window.Seconds()/float64(b.N), "holdings/s")
			})
		}
	}
}

// oneFault applies faults of one kind until ctx ends.
func (r *advRig) oneFault(ctx context.Context, rng *rand.Rand, kind string) {
	if kind == "none" {
		return
	}
	// after runs f once d has passed, or ctx has ended.
	after := func(d time.Duration, f func()) {
		go func() {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
			f()
		}()
	}
	every := 300 * time.Millisecond
	if kind == "restart" {
		every = 1500 * time.Millisecond // each costs a TTL
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every + time.Duration(rng.IntN(300))*time.Millisecond):
		}
		i := rng.IntN(len(r.clients))
		id := r.clients[i].ID()
		r.srvMu.Lock()
		srv := r.srv
		r.srvMu.Unlock()
		lasts := time.Duration(rng.IntN(1500)) * time.Millisecond
		switch kind {
		case "kick":
			_ = srv.Kick(id)
		case "drop":
			_ = srv.Drop(id)
		case "hold":
			if srv.Hold(id, localstore.Both) == nil {
				after(lasts, func() { srv.Release(id) })
			}
		case "slow-answers":
			srv.SetResponseFault(id, localstore.ResponseFault{Delay: time.Duration(rng.IntN(900)) * time.Millisecond})
			after(lasts, func() { srv.SetResponseFault(id, localstore.ResponseFault{}) })
		case "blackhole":
			p := r.proxies[i]
			p.Blackhole()
			after(lasts, p.Heal)
		case "cut":
			r.proxies[i].Cut()
		case "delay":
			p := r.proxies[i]
			p.SetDelay(time.Duration(rng.IntN(300)) * time.Millisecond)
			after(lasts, func() { p.SetDelay(0) })
		case "restart":
			r.restart(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
	}
}
