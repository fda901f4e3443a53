package leader_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
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
