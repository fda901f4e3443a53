package lock_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
)

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
			r := &advRig{t: t, srv: srv, cfg: tc.cfg, admin: dial(t, srv.Addr()), restarts: tc.restarts, acquire: true}
			for range 2 {
				p := startProxy(t, srv.Addr())
				c := dial(t, p.Addr())
				for range 3 {
					r.proxies = append(r.proxies, p)
					r.clients = append(r.clients, c)
				}
			}
			r.run(10*time.Second, seed, func(ctx context.Context) { r.faults(ctx, rand.New(rand.NewPCG(seed, seed))) })
		})
	}
}
