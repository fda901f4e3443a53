package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/sskv"
)

// BenchmarkIdleClientRSS measures what an idle sskv client costs the real
// standalone store process, from outside: DSSLOCK_BENCH_KEYS keys (default
// 10,000) are set as in BenchmarkProcessRSS, then DSSLOCK_BENCH_CONNS sskv
// clients (default 100; issue 34's figure is 2,000) dial the store from
// this process with the default Config (their response and notification
// subscriptions, a 5 s keep-alive), and the store's RSS is read
// DSSLOCK_BENCH_SETTLE (default 30 s) after the last one connected, while
// they keep pinging. It reports the RSS at each step (MB) and per client
// (B).
//
//	DSSLOCK_BENCH_CONNS=2000 go test -run '^$' -bench IdleClientRSS -benchtime 1x ./cmd/statestore/
func BenchmarkIdleClientRSS(b *testing.B) {
	keys := benchSize(b, "DSSLOCK_BENCH_KEYS", 10_000)
	conns := benchSize(b, "DSSLOCK_BENCH_CONNS", 100)
	settle := time.Duration(benchSize(b, "DSSLOCK_BENCH_SETTLE", 30)) * time.Second
	for b.Loop() {
		p := startProcB(b)
		pid := p.cmd.Process.Pid
		loadKeys(b, p.addr, keys)
		withKeys := rss(b, pid)

		ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
		clients := make([]*sskv.Client, conns)
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		for i := range clients {
			g.Go(func() error {
				c, err := sskv.Dial(gctx, sskv.Config{Addr: p.addr, ClientID: fmt.Sprintf("idle-%d", i)})
				clients[i] = c
				return err
			})
		}
		err := g.Wait()
		cancel()
		b.Cleanup(func() {
			for _, c := range clients {
				if c != nil {
					_ = c.Close()
				}
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		// The figure is defined as the RSS this long after the clients
		// connected: the wait is the measurement, not a stand-in for a
		// signal.
		<-time.After(settle)
		withClients := rss(b, pid)
		b.ReportMetric(float64(withKeys)/1e6, "keys-RSS-MB")
		b.ReportMetric(float64(withClients)/1e6, "clients-RSS-MB")
		b.ReportMetric(float64(withClients-withKeys)/float64(conns), "RSS-B/client")
	}
}
