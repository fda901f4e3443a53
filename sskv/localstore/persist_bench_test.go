package localstore_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// BenchmarkPersistedSet measures SET through one sskv client with 64
// requests in flight (and with one: 1-inflight, the latency of a lone SET),
// against a store that keeps keys in memory only
// (memory) and one that persists every key (persist-all; each answer waits
// for its group commit to be durable). ns/op is the inverse of throughput;
// p50-ms and p99-ms are the latency of one SET. The ratio of the two
// sub-benchmarks' SET/s is persistence's cost in throughput.
func BenchmarkPersistedSet(b *testing.B) {
	for _, bench := range []struct {
		mode     localstore.PersistMode
		inflight int
	}{{localstore.PersistNone, 64}, {localstore.PersistAll, 64}, {localstore.PersistNone, 1}, {localstore.PersistAll, 1}} {
		mode := bench.mode
		name := "memory"
		if mode != localstore.PersistNone {
			name = "persist-all"
		}
		if bench.inflight == 1 {
			name += "/1-inflight"
		}
		b.Run(name, func(b *testing.B) {
			cfg := localstore.Config{Persist: mode}
			if mode != localstore.PersistNone {
				cfg.DataDir = b.TempDir()
			}
			srv, err := localstore.Start(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			ctx := context.Background()
			c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "bench-persist"})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			value := make([]byte, 64)
			var (
				mu  sync.Mutex
				lat []time.Duration
				wg  sync.WaitGroup
				n   = make(chan int, bench.inflight)
			)
			b.ResetTimer()
			start := time.Now()
			for g := range bench.inflight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []time.Duration
					for i := range n {
						t0 := time.Now()
						if _, err := c.Set(ctx, fmt.Sprintf("bench-%02d-%d", g, i%1000), value, sskv.SetOptions{}); err != nil {
							b.Error(err)
							return
						}
						mine = append(mine, time.Since(t0))
					}
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
			}
			for i := 0; i < b.N; i++ {
				n <- i
			}
			close(n)
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "SET/s")
			storetest.ReportPercentiles(b, lat, "ms")
		})
	}
}

// BenchmarkRestartRecovery measures Restart of a store in mode all holding
// DSSLOCK_BENCH_RECOVERY_KEYS persisted keys (default 100,000; the issue's
// goal is for 1,000,000: at most 10 s), 64-byte values: from the crash to
// the first GET of a persisted key answered by the new store.
func BenchmarkRestartRecovery(b *testing.B) {
	n := 100_000
	if s := os.Getenv("DSSLOCK_BENCH_RECOVERY_KEYS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("DSSLOCK_BENCH_RECOVERY_KEYS: %v", err)
		}
		n = v
	}
	dir := b.TempDir()
	if err := localstore.FillDataDir(dir, n, 64); err != nil {
		b.Fatal(err)
	}
	srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	if srv.Len() != n {
		b.Fatalf("loaded %d keys, want %d", srv.Len(), n)
	}
	ctx := context.Background()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "bench-recovery",
		ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if srv, err = srv.Restart(ctx, 0); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(t0).Milliseconds()), "start-ms")
		r, err := c.Get(ctx, "fill-000000001")
		if err != nil || !r.Found {
			b.Fatalf("GET after the restart: %+v, %v", r, err)
		}
		b.ReportMetric(time.Since(t0).Seconds(), "s-to-first-GET")
	}
	b.StopTimer()
	_ = srv.Close()
}
