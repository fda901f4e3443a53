package interop

// Benchmarks of cost as the number of locks, elections and waiters grows,
// dsslock beside the SDK where the SDK has the feature. Each runs once per
// invocation (use -benchtime=1x) and measures a window of steady state, set
// by DSSLOCK_SCALE_WINDOW (default 20s); the sizes come from
// DSSLOCK_SCALE_LOCKS (default 1000; a comma-separated list runs each). For
// example, the figures of 10,000 locks over a minute:
//
//	DSSLOCK_SCALE_LOCKS=10000 DSSLOCK_SCALE_WINDOW=1m \
//	    go test -run '^$' -bench ManyLocks -benchtime=1x -timeout 30m
//
// CPU is reported in seconds per minute of the window: the client's is this
// process's (only one side runs at a time), the store's that of the
// statestore process TestMain started (not reported for an external store).

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"
	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// newScaleEnv is newBenchEnv with room for a window of steady state.
func newScaleEnv(b *testing.B, window time.Duration) *env {
	b.Helper()
	e := newEnvTimeout(b, window+benchTimeout)
	e.quiet = true
	return e
}

// scaleWindow is how long a scale benchmark measures steady state.
func scaleWindow(b *testing.B) time.Duration {
	if v := os.Getenv("DSSLOCK_SCALE_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("DSSLOCK_SCALE_WINDOW=%q: %v", v, err)
		}
		return d
	}
	return 20 * time.Second
}

// scaleSizes returns the sizes in the environment variable name, or def.
func scaleSizes(b *testing.B, name string, def ...int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: not a list of positive numbers", name, v)
		}
		ns = append(ns, n)
	}
	return ns
}

// cpuMeter measures the CPU time of this process and of the store process.
type cpuMeter struct {
	start      time.Time
	self, peer time.Duration
}

func startCPU() cpuMeter {
	return cpuMeter{start: time.Now(), self: selfCPU(), peer: procCPU(storePID)}
}

// report reports both CPU times per minute of wall time since start.
func (m cpuMeter) report(b *testing.B) {
	wall := time.Since(m.start).Minutes()
	b.ReportMetric((selfCPU()-m.self).Seconds()/wall, "client-cpu-s/min")
	if storePID != 0 {
		b.ReportMetric((procCPU(storePID)-m.peer).Seconds()/wall, "store-cpu-s/min")
	}
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU returns the user and system CPU time of process pid, from
// /proc/pid/stat (Linux; 0 elsewhere).
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck
}

// footprint is this process's goroutines and live heap.
type footprint struct {
	goroutines int
	heap       uint64
}

func measure() footprint {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
}

// leastOf measures k times, every, and returns the least heap seen (and
// the goroutines then): a snapshot taken while renewals are in flight
// counts their requests and buffers, which come and go.
func leastOf(k int, every time.Duration) footprint {
	least := measure()
	for range k - 1 {
		time.Sleep(every)
		if f := measure(); f.heap < least.heap {
			least = f
		}
	}
	return least
}

// reportPer reports the goroutines and heap bytes between before and after,
// per one of n things.
func reportPer(b *testing.B, before, after footprint, n int, what string) {
	b.ReportMetric(float64(after.goroutines-before.goroutines)/float64(n), "goroutines/"+what)
	b.ReportMetric((float64(after.heap)-float64(before.heap))/float64(n), "heap-B/"+what)
}

// latencies collects durations from many goroutines.
type latencies struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.ds = append(l.ds, d)
	l.mu.Unlock()
}

func (l *latencies) take() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	ds := l.ds
	l.ds = nil
	return ds
}

// holdWindow reports what the n locks just taken cost over before, calls
// start, and reports the CPU used over the window that follows.
func holdWindow(b *testing.B, before footprint, n int, window time.Duration, start func()) {
	b.ResetTimer()
	reportPer(b, before, measure(), n, "lock")
	cpu := startCPU()
	start()
	time.Sleep(window)
	cpu.report(b)
}

// acquireAll takes n locks with acquire, 64 at a time, and fails if one
// was not taken.
func acquireAll(ctx context.Context, n int, acquire func(ctx context.Context, i int) (bool, error)) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i := range n {
		g.Go(func() error {
			if ok, err := acquire(ctx, i); !ok || err != nil {
				return fmt.Errorf("lock %d: acquired %v, %v", i, ok, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// countMissing counts the keys that are not held by the holder that took
// them: missing, or someone else's.
func countMissing(ctx context.Context, c *sskv.Client, keys []string, holders []string) (int, error) {
	var mu sync.Mutex
	missing := 0
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for i, k := range keys {
		g.Go(func() error {
			res, err := c.Get(ctx, k)
			if err != nil {
				return err
			}
			if !res.Found || !strings.HasPrefix(string(res.Value), holders[i]) {
				mu.Lock()
				missing++
				mu.Unlock()
			}
			return nil
		})
	}
	return missing, g.Wait()
}

// BenchmarkManyLocks: n locks (TTL 10 s, default renewal) held on one
// client for the window. Reported: CPU per minute of the client process
// and of the store, goroutines and heap per held lock (after all were
// taken, over before), the renewals' latency (dsslock: as OnRenewal reports
// it; the SDK does not expose it) and how many keys were lost by the end
// (not held by the holder that took them).
func BenchmarkManyLocks(b *testing.B) {
	const ttl = 10 * time.Second
	window := scaleWindow(b)
	for _, n := range scaleSizes(b, "DSSLOCK_SCALE_LOCKS", 1000) {
		b.Run(fmt.Sprintf("dsslock/locks=%d", n), func(b *testing.B) {
			e := newScaleEnv(b, window)
			checker := e.ourClient("checker")
			before := measure()
			var drops atomic.Int64
			var lastDrop atomic.Value
			c, err := sskv.Dial(e.ctx, sskv.Config{
				Addr:     storeAddress(),
				ClientID: fmt.Sprintf("dsslock-holder-%s", randHex(4)),
				Metrics: sskv.Metrics{ConnectionDown: func(_ uint64, cause error) {
					drops.Add(1)
					if cause != nil {
						lastDrop.Store(cause.Error())
					}
				}},
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = c.Close() })
			var lat latencies
			var renewErrs sync.Map
			ls := make([]*lock.Lock, n)
			keys := make([]string, n)
			ids := make([]string, n)
			for i := range ls {
				keys[i] = e.key(fmt.Sprintf("l%d", i))
				l, err := lock.New(c, lock.Config{Name: keys[i], TTL: ttl, OnRenewal: func(d time.Duration, err error) {
					lat.add(d)
					if err != nil {
						renewErrs.Store(i, err)
					}
				}})
				if err != nil {
					b.Fatal(err)
				}
				ls[i], ids[i] = l, l.HolderID()
			}
			if err := acquireAll(e.ctx, len(ls), func(ctx context.Context, i int) (bool, error) {
				return ls[i].TryLock(ctx)
			}); err != nil {
				b.Fatal(err)
			}
			holdWindow(b, before, n, window, func() { lat.take() }) // latencies of the window only
			renewals := lat.take()
			reportPercentiles(b, renewals, "renew-ms")
			b.ReportMetric(float64(len(renewals))/window.Seconds(), "renewals/s")
			b.StopTimer()
			lost := 0
			reasons := map[string]int{} // why the locks were lost, for the log
			for _, l := range ls {
				if err := l.Err(); err != nil {
					lost++
					reasons[strings.TrimPrefix(err.Error(), fmt.Sprintf("lock %q: ", l.Name()))]++
				}
			}
			for why, k := range reasons {
				b.Logf("%d locks lost: %s", k, why)
			}
			missing, err := countMissing(e.ctx, checker, keys, ids)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(lost), "lost")
			b.ReportMetric(float64(drops.Load()), "conn-lost")
			if v := lastDrop.Load(); v != nil {
				b.Logf("last connection lost: %v", v)
			}
			b.ReportMetric(float64(missing), "keys-lost")
			g, ctx := errgroup.WithContext(e.ctx)
			g.SetLimit(64)
			for _, l := range ls {
				g.Go(func() error { return l.Close(ctx) })
			}
			_ = g.Wait()
		})
		b.Run(fmt.Sprintf("sdk/locks=%d", n), func(b *testing.B) {
			e := newScaleEnv(b, window)
			checker := e.ourClient("checker")
			before := measure()
			c := e.newClient("holder")
			ls := make([]*leasedlock.Lease[string, string], n)
			keys := make([]string, n)
			ids := make([]string, n)
			for i := range ls {
				keys[i] = e.key(fmt.Sprintf("l%d", i))
				ls[i], ids[i] = leasedlock.NewLease(c.ss, keys[i]), c.id
			}
			if err := acquireAll(e.ctx, len(ls), func(ctx context.Context, i int) (bool, error) {
				return ls[i].Acquire(ctx, ttl, leasedlock.WithRenew(ttl/3))
			}); err != nil {
				b.Fatal(err)
			}
			holdWindow(b, before, n, window, func() {})
			b.StopTimer()
			missing, err := countMissing(e.ctx, checker, keys, ids)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(missing), "keys-lost")
			// Release after WithRenew leaves the SDK's renew goroutine
			// spinning (see BenchmarkWaiterRequests): its client's cleanup
			// ends them.
		})
	}
}

// BenchmarkManyElections: e elections (TTL 10 s, default renewal), each
// with 3 candidates on 3 clients shared by all elections; one candidate
// of each election leads, two wait in Campaign. Reported: goroutines and heap
// per election that the library adds (the goroutines this benchmark
// blocks in Campaign are not counted, nor the runtime's records of the
// goroutines it starts to call Campaign, which it reports apart as
// callers-heap-B/election), CPU per minute of the client
// process and the store, the leaders' renewal latency, and how the
// leaderships fall on the candidates (most and fewest led by one).
// dsslock only: the SDK has no leader election.
func BenchmarkManyElections(b *testing.B) {
	window := scaleWindow(b)
	if os.Getenv("DSSLOCK_SCALE_HEAPPROFILE") != "" {
		// A sample every 4 KiB, not every 512: a profile fine enough to
		// tell what each election keeps (every allocation would slow the
		// start so much that terms are lost).
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 4096
	}
	for _, n := range scaleSizes(b, "DSSLOCK_SCALE_ELECTIONS", 1000) {
		b.Run(fmt.Sprintf("dsslock/elections=%d", n), func(b *testing.B) {
			e := newScaleEnv(b, window)
			// What the caller has before it campaigns is not the
			// elections' cost: the clients, the election names, and the
			// 3n goroutines that call Campaign, started before the
			// baseline and waiting for start.
			warm := measure()
			var cs [3]*sskv.Client
			for i := range cs {
				cs[i] = e.ourClient(fmt.Sprintf("candidate%d", i))
			}
			var lat latencies
			var (
				renewals   atomic.Int64
				allRenewed = make(chan struct{})
			)
			metrics := leader.WithMetrics(leader.Metrics{Renewal: func(d time.Duration, _ error) {
				lat.add(d)
				if renewals.Add(1) == int64(n) {
					close(allRenewed)
				}
			}})
			ctx, cancel := context.WithCancel(e.ctx)
			defer cancel()
			var (
				mu      sync.Mutex
				terms   = make([]*leader.Term, 0, n)
				led     [3]int
				waiting sync.WaitGroup
				ready   sync.WaitGroup
				start   = make(chan struct{})
				elected = make(chan struct{}, 3*n)
			)
			for i := range n {
				name := e.key(fmt.Sprintf("e%d", i))
				for k, c := range cs {
					waiting.Add(1)
					ready.Add(1)
					go func() {
						defer waiting.Done()
						ready.Done()
						<-start
						t, err := leader.Campaign(ctx, c, name, nil, metrics)
						if err != nil {
							return
						}
						mu.Lock()
						terms = append(terms, t)
						led[k]++
						mu.Unlock()
						elected <- struct{}{}
					}()
				}
			}
			ready.Wait()
			before := measure()
			before.goroutines -= 3 * n
			writeHeapProfile(b, ".base")
			close(start)
			for range n {
				<-elected
			}
			// Measure once the leaders have renewed n times (about once
			// each, as renewals are spread out): a holding's first
			// renewal may leave it something its acquisition did not (a
			// context's map of children did, until 2026-11-27, and the
			// measure taken before it missed that). By then the followers
			// have settled on their watches too (within 2 s, which has no
			// signal). The n leaders' goroutines have returned, the 2n
			// followers' are blocked in Campaign.
			select {
			case <-allRenewed:
			case <-e.ctx.Done():
				b.Fatal("the leaders did not all renew")
			}
			b.ResetTimer()
			held := leastOf(10, 500*time.Millisecond)
			held.goroutines -= 2 * n
			reportPer(b, before, held, n, "election")
			b.ReportMetric((float64(before.heap)-float64(warm.heap))/float64(n), "callers-heap-B/election")
			writeHeapProfile(b, "")
			cpu := startCPU()
			lat.take()
			time.Sleep(window)
			cpu.report(b)
			reportPercentiles(b, lat.take(), "renew-ms")
			b.StopTimer()
			mu.Lock()
			most, fewest := max(led[0], led[1], led[2]), min(led[0], led[1], led[2])
			lostTerms := 0
			for _, t := range terms {
				if t.Err() != nil {
					lostTerms++
				}
			}
			ts := terms
			mu.Unlock()
			b.ReportMetric(float64(most), "most-led")
			b.ReportMetric(float64(fewest), "fewest-led")
			b.ReportMetric(float64(lostTerms), "lost")
			cancel()
			waiting.Wait()
			g, gctx := errgroup.WithContext(e.ctx)
			g.SetLimit(64)
			for _, t := range ts {
				g.Go(func() error { return t.Resign(gctx) })
			}
			_ = g.Wait()
		})
	}
}

// writeHeapProfile writes the heap profile to the file that
// DSSLOCK_SCALE_HEAPPROFILE names, with suffix, if any: what the steady
// state holds, or (suffix ".base") what was there before. go tool pprof
// -base path.base path shows what the elections keep.
func writeHeapProfile(b *testing.B, suffix string) {
	path := os.Getenv("DSSLOCK_SCALE_HEAPPROFILE")
	if path == "" {
		return
	}
	path += suffix
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}
