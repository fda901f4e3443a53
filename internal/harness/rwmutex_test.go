package harness_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
)

// rwHolding is one holding of the RWMutex as its holder saw it: from the
// return of RLock or Lock (in) until its Done closed or its work returned,
// whichever came first (out). epoch counts the store restarts before in
// and after out: tokens are compared within one store's life only.
type rwHolding struct {
	who               int
	write             bool
	token             hlc.Timestamp
	in, out           time.Time
	epochIn, epochOut int64
}

// TestRWMutexHarness runs participants of one lock.RWMutex, each behind its
// own fault proxy, reading and writing at random, while faults are injected
// (blackholed and cut paths, delay, store restarts), and checks the
// holdings it recorded against the RWMutex's oracle: never a writer with
// anyone else, and a holding's token newer than that of every write (for a
// writer, every holding) that ended before it began. DSSLOCK_RW_SCHEDULES
// (default 3) schedules from DSSLOCK_SEED (default 1000).
func TestRWMutexHarness(t *testing.T) {
	n := envInt(t, "DSSLOCK_RW_SCHEDULES", 3)
	first := envInt(t, "DSSLOCK_SEED", 1000)
	for seed := first; seed < first+n; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			hs, faults := runRWSchedule(t, seed)
			writes, reads, most := 0, 0, 0
			for _, h := range hs {
				if h.write {
					writes++
				} else {
					reads++
				}
			}
			for _, v := range checkRW(hs) {
				t.Error(v)
			}
			most = mostReaders(hs)
			t.Logf("seed %d: %d writes, %d reads (at most %d at once), faults %v", seed, writes, reads, most, faults)
			if writes == 0 || reads == 0 {
				t.Errorf("seed %d: %d writes, %d reads: want some of each", seed, writes, reads)
			}
		})
	}
}

// checkRW returns the oracle's violations in hs.
func checkRW(hs []rwHolding) []string {
	var vs []string
	for i, w := range hs {
		for j, x := range hs {
			if i == j {
				continue
			}
			if w.write && x.in.Before(w.out) && w.in.Before(x.out) {
				vs = append(vs, fmt.Sprintf("participant %d wrote (token %v, %v to %v) while participant %d held (write %v, token %v, %v to %v)",
					w.who, w.token, w.in.Format(time.StampMicro), w.out.Format(time.StampMicro), x.who, x.write, x.token, x.in.Format(time.StampMicro), x.out.Format(time.StampMicro)))
			}
			if x.out.Before(w.in) && x.epochOut == w.epochIn && w.epochIn == w.epochOut && (w.write || x.write) && !w.token.After(x.token) {
				vs = append(vs, fmt.Sprintf("participant %d's holding (write %v, token %v) began after participant %d's (write %v) ended, with a token not newer (%v)",
					w.who, w.write, w.token, x.who, x.write, x.token))
			}
		}
	}
	return vs
}

// mostReaders is the most read holdings of hs at once.
func mostReaders(hs []rwHolding) int {
	type edge struct {
		at time.Time
		d  int
	}
	var es []edge
	for _, h := range hs {
		if !h.write {
			es = append(es, edge{h.in, 1}, edge{h.out, -1})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].at.Before(es[j].at) || es[i].at.Equal(es[j].at) && es[i].d < es[j].d })
	most, cur := 0, 0
	for _, e := range es {
		cur += e.d
		most = max(most, cur)
	}
	return most
}

// runRWSchedule runs one schedule of seed and returns its holdings and how
// many faults of each kind it injected.
func runRWSchedule(t *testing.T, seed int64) ([]rwHolding, map[string]int) {
	const (
		participants = 5
		rwTTL        = 1200 * time.Millisecond // room for a loaded machine between Done and the store's expiry
		faultPhase   = 5 * time.Second
	)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	srv := storetest.Start(t)
	var epoch atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), faultPhase)
	defer cancel()

	var (
		mu sync.Mutex
		hs []rwHolding
	)
	proxies := make([]*faultproxy.Proxy, participants)
	var wg sync.WaitGroup
	for i := range participants {
		p, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		proxies[i] = p
		c := storetest.DialPatient(t, p.Addr(), fmt.Sprintf("rw-%d-%d", seed, i))
		m, err := lock.NewRWMutex(c, lock.RWMutexConfig{Name: "rw", MaxReaders: 3, TTL: rwTTL})
		if err != nil {
			t.Fatal(err)
		}
		prng := rand.New(rand.NewPCG(uint64(seed), uint64(i+1)))
		wg.Go(func() {
			defer m.Close(context.Background())
			for ctx.Err() == nil {
				write := prng.IntN(3) == 0
				acquire, release := m.RLock, m.RUnlock
				if write {
					acquire, release = m.Lock, m.Unlock
				}
				e := epoch.Load()
				if err := acquire(ctx); err != nil {
					// ctx ended, or a fault (nothing held): back off a
					// little, as a store down fails at once.
					backoff := time.NewTimer(20 * time.Millisecond)
					select {
					case <-ctx.Done():
					case <-backoff.C:
					}
					backoff.Stop()
					continue
				}
				h := rwHolding{who: i, write: write, token: m.Token(), in: time.Now(), epochIn: e}
				work := time.NewTimer(time.Duration(5+prng.IntN(40)) * time.Millisecond)
				select {
				case <-m.Done():
				case <-work.C: // the guarded work
				}
				work.Stop()
				h.out, h.epochOut = time.Now(), epoch.Load()
				mu.Lock()
				hs = append(hs, h)
				mu.Unlock()
				rctx, rcancel := context.WithTimeout(context.Background(), rwTTL)
				_ = release(rctx) // a key it misses expires
				rcancel()
			}
		})
	}

	// Faults: one every 100 to 400 ms, each healed after 0.5 to 2 TTLs
	// (but a store restart, which heals itself).
	faults := map[string]int{}
	var heals []*time.Timer
	for ctx.Err() == nil {
		timer := time.NewTimer(time.Duration(100+rng.IntN(300)) * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		timer.Stop()
		if ctx.Err() != nil {
			break
		}
		p := proxies[rng.IntN(participants)]
		d := rwTTL/2 + time.Duration(rng.Int64N(int64(3*rwTTL/2)))
		switch k := rng.IntN(10); {
		case k < 4:
			faults["blackhole"]++
			p.Blackhole()
			heals = append(heals, time.AfterFunc(d, p.Heal))
		case k < 6:
			faults["partition"]++
			p.Partition()
			heals = append(heals, time.AfterFunc(d, p.Heal))
		case k < 8:
			faults["cut"]++
			p.Cut()
		case k < 9:
			faults["delay"]++
			p.SetDelay(time.Duration(10+rng.IntN(60)) * time.Millisecond)
			heals = append(heals, time.AfterFunc(d, func() { p.SetDelay(0) }))
		default:
			faults["restart"]++
			epoch.Add(1)
			srv = storetest.Restart(t, srv, time.Duration(100+rng.IntN(400))*time.Millisecond)
			epoch.Add(1)
		}
	}
	wg.Wait()
	for _, h := range heals {
		h.Stop()
	}
	for _, p := range proxies {
		p.Heal()
		p.SetDelay(0)
	}
	return hs, faults
}

// The oracle catches a writer beside a reader, and a writer's token not
// newer than an earlier reader's.
func TestCheckRWCatches(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	tok := func(w int64) hlc.Timestamp { return hlc.Timestamp{Wall: w, Node: "store"} }
	ok := []rwHolding{
		{who: 0, token: tok(1), in: at(0), out: at(10)},
		{who: 1, token: tok(2), in: at(5), out: at(12)},
		{who: 2, write: true, token: tok(3), in: at(13), out: at(20)},
		{who: 0, token: tok(4), in: at(21), out: at(30)},
	}
	if vs := checkRW(ok); len(vs) != 0 {
		t.Errorf("violations in a good history: %v", vs)
	}
	overlap := append([]rwHolding{}, ok...)
	overlap[2].in = at(11)
	if vs := checkRW(overlap); len(vs) != 1 {
		t.Errorf("writer beside a reader: %v", vs)
	}
	stale := append([]rwHolding{}, ok...)
	stale[2].token = tok(2)
	if vs := checkRW(stale); len(vs) != 1 {
		t.Errorf("writer's token not after a reader's: %v", vs)
	}
}
