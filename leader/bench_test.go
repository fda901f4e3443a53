package leader_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

var reportPercentiles = storetest.ReportPercentiles

// Campaign on a free election and Resign: three requests (SET NEX PX, the
// fenced SET of the token, VDEL).
func BenchmarkCampaignResign(b *testing.B) {
	srv := startStore(b)
	c := dial(b, srv.Addr())
	ctx := testCtx(b)
	b.ReportAllocs()
	for b.Loop() {
		t, err := leader.Campaign(ctx, c, "e", []byte("v"))
		if err != nil {
			b.Fatal(err)
		}
		if err := t.Resign(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// Resign to new leader: from the start of the leader's Resign to the
// follower's Campaign returning, between two clients; the roles swap every
// round.
func BenchmarkResignHandover(b *testing.B) {
	srv := startStore(b)
	cs := [2]*sskv.Client{dial(b, srv.Addr()), dial(b, srv.Addr())}
	ctx := testCtx(b)
	term, err := leader.Campaign(ctx, cs[0], "e", []byte("0"), leader.WithTTL(time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	i := 0
	for b.Loop() {
		w := (i + 1) % 2
		i++
		type elected struct {
			t  *leader.Term
			at time.Time
		}
		got := make(chan elected, 1)
		go func() {
			t, err := leader.Campaign(ctx, cs[w], "e", []byte{byte('0' + w)}, leader.WithTTL(time.Minute))
			if err != nil {
				b.Error(err)
			}
			got <- elected{t, time.Now()}
		}()
		// The follower is parked on its watch before the leader resigns.
		waitFor(b, "the follower to watch", func() bool { return srv.Watching(cs[w].ID(), "e") })
		start := time.Now()
		if err := term.Resign(ctx); err != nil {
			b.Fatal(err)
		}
		e := <-got
		if e.t == nil {
			b.FailNow()
		}
		ds = append(ds, e.at.Sub(start))
		term = e.t
	}
	b.StopTimer()
	_ = term.Resign(ctx)
	reportPercentiles(b, ds, "ms")
}

// Crash to new leader: the leader's client disappears right after its
// election (its last write); measured from Campaign returning to the
// follower's Campaign returning, minus the TTL. Run with -benchtime Nx: each
// round takes a TTL.
func BenchmarkCrashTakeover(b *testing.B) {
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second} {
		b.Run(ttl.String(), func(b *testing.B) {
			srv := startStore(b)
			cf := dial(b, srv.Addr())
			ctx := context.Background()
			var ds []time.Duration
			for b.Loop() {
				c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: storetest.ID(b)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := leader.Campaign(ctx, c, "e", []byte("crashes"), leader.WithTTL(ttl)); err != nil {
					b.Fatal(err)
				}
				last := time.Now()
				got := make(chan *leader.Term, 1)
				go func() {
					t, err := leader.Campaign(ctx, cf, "e", []byte("follower"), leader.WithTTL(ttl))
					if err != nil {
						b.Error(err)
					}
					got <- t
				}()
				waitFor(b, "the follower to watch", func() bool { return srv.Watching(cf.ID(), "e") })
				_ = c.Close() // crash: no more renewals, no resignation
				t := <-got
				if t == nil {
					b.FailNow()
				}
				ds = append(ds, time.Since(last)-ttl)
				if err := t.Resign(ctx); err != nil {
					b.Fatal(err)
				}
			}
			reportPercentiles(b, ds, "ms-over-TTL")
		})
	}
}

// BenchmarkGroup: E elections (1,000; DSSLOCK_GROUP_ELECTIONS changes it)
// in a Group (the default TTL, 10 s; DSSLOCK_GROUP_TTL_MS changes it), each
// member on its own client, with the work of TestGroup (a fenced write at
// the start of each term and every TTL, one work per election at a time). Three members start together; reported: the time
// until each leads E/3 (balance-s), the goroutines and heap added per
// election once balanced (the work's goroutine included, and the heap of
// the in-process store and of the clients too), the requests per second
// and election the members send while the leadership is steady (the
// work's writes not counted), the time from a member's crash (its client
// closed) until all its elections are led again, less the TTL
// (takeover-ms-over-TTL), the time until the two left lead E/2 each
// (rebalance-s), and, after a replacement joined, the time until a fourth
// member leads E/4 (join4-s). Run with -benchtime 1x: a round takes a few
// TTLs.
func BenchmarkGroup(b *testing.B) {
	e := envInt(b, "DSSLOCK_GROUP_ELECTIONS", 1000)
	ttl := time.Duration(envInt(b, "DSSLOCK_GROUP_TTL_MS", int(lock.DefaultTTL/time.Millisecond))) * time.Millisecond
	b.ReportAllocs()
	for b.Loop() {
		r := newGroupRig(b, e, ttl, leader.WithTTL(ttl))
		observer := dial(b, r.srv.Addr())
		goroutines, heap := runtimeUse()
		var c *groupMember
		for _, name := range []string{"a", "b", "c"} {
			c = r.start(name)
		}
		balance := r.await("3 members balanced", 30*time.Second, r.balanced)
		b.StopTimer()
		time.Sleep(ttl) // the handovers' resigns are over
		g2, h2 := runtimeUse()
		// A window of steady leadership: renewals and the work's writes.
		requests := func() (n int64) {
			for _, m := range r.members {
				n += r.srv.Requests(m.c.ID())
			}
			return n
		}
		n0, w0 := requests(), r.writes.Load()
		time.Sleep(ttl)
		steady := float64(requests()-n0-(r.writes.Load()-w0)) / ttl.Seconds() / float64(e)
		b.StartTimer()
		r.checkObserved(observer)

		orphans := c.g.Leading()
		killed := time.Now()
		r.kill(c)
		r.await("the killed member's elections led again", ttl+10*time.Second, func() bool { return r.ledBy(orphans) })
		takeover := time.Since(killed)
		rebalance := r.await("2 members balanced", 30*time.Second, r.balanced)

		r.start("c2")
		r.await("3 members balanced again", 30*time.Second, r.balanced)
		d := r.start("d")
		join4 := r.await("the fourth member leading E/4", 30*time.Second, func() bool {
			n := len(d.g.Leading())
			return n >= e/4 && n <= (e+3)/4
		})
		r.await("4 members balanced", 30*time.Second, r.balanced)
		b.StopTimer()
		if r.checkStale(observer) == 0 {
			b.Error("no ended term checked")
		}
		b.ReportMetric(balance.Seconds(), "balance-s")
		b.ReportMetric(float64(g2-goroutines)/float64(e), "goroutines/election")
		b.ReportMetric(float64(h2-heap)/float64(e), "heap-B/election")
		b.ReportMetric(steady, "req/s/election")
		b.ReportMetric(float64((takeover - ttl).Milliseconds()), "takeover-ms-over-TTL")
		b.ReportMetric(rebalance.Seconds(), "rebalance-s")
		b.ReportMetric(join4.Seconds(), "join4-s")
		b.StartTimer()
	}
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// runtimeUse returns the goroutines and the heap in use, after a GC.
func runtimeUse() (int, uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapInuse
}

// Priority takeover: a candidate of a higher priority than the leader's
// joins; the leader's work (which returns as soon as its context ends)
// hands over. Measured from the candidate's Campaign call to its return.
func BenchmarkPriorityTakeover(b *testing.B) {
	srv := startStore(b)
	cs := [2]*sskv.Client{dial(b, srv.Addr()), dial(b, srv.Addr())}
	ctx := testCtx(b)
	ttl := leader.WithTTL(time.Minute)
	term, err := leader.Campaign(ctx, cs[0], "e", []byte("0"), ttl, leader.WithPriority(0))
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	i := 0
	for b.Loop() {
		w := (i + 1) % 2
		i++
		// The leader's work: it returns once the term is asked for.
		go func(t *leader.Term) {
			<-t.Context().Done()
			_ = t.Resign(ctx)
		}(term)
		start := time.Now()
		t, err := leader.Campaign(ctx, cs[w], "e", []byte{byte('0' + w)}, ttl, leader.WithPriority(i))
		if err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
		term = t
	}
	b.StopTimer()
	_ = term.Resign(ctx)
	reportPercentiles(b, ds, "ms")
}

// Transfer: the leader hands the election to a named waiting candidate.
// Measured from Term.Transfer to the candidate's Campaign returning.
func BenchmarkTransfer(b *testing.B) {
	srv := startStore(b)
	cs := [2]*sskv.Client{dial(b, srv.Addr()), dial(b, srv.Addr())}
	ctx := testCtx(b)
	ttl := leader.WithTTL(time.Minute)
	term, err := leader.Campaign(ctx, cs[0], "e", []byte("0"), ttl, leader.WithCandidateID("0"))
	if err != nil {
		b.Fatal(err)
	}
	var ds []time.Duration
	i := 0
	for b.Loop() {
		w := (i + 1) % 2
		i++
		type elected struct {
			t  *leader.Term
			at time.Time
		}
		got := make(chan elected, 1)
		id := string(rune('0' + w))
		go func() {
			t, err := leader.Campaign(ctx, cs[w], "e", []byte(id), ttl, leader.WithCandidateID(id))
			if err != nil {
				b.Error(err)
			}
			got <- elected{t, time.Now()}
		}()
		waitFor(b, "the follower to watch", func() bool { return srv.Watching(cs[w].ID(), "e") })
		start := time.Now()
		if err := term.Transfer(ctx, id); err != nil {
			b.Fatal(err)
		}
		e := <-got
		if e.t == nil {
			b.FailNow()
		}
		ds = append(ds, e.at.Sub(start))
		term = e.t
	}
	b.StopTimer()
	_ = term.Resign(ctx)
	reportPercentiles(b, ds, "ms")
}
