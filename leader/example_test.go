package leader_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A candidate campaigns, writes through a fenced writer while it leads, and
// resigns once its work is done.
func ExampleCampaign() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "replica-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	term, err := leader.Campaign(ctx, c, "orders/leader", []byte("10.0.0.5:8080"), leader.WithCandidateID("replica-1"))
	if err != nil {
		log.Fatal(err)
	}
	// The work: writes fenced with the term's token. They fail with
	// fenced.ErrStale once a later term has written the key.
	w := fenced.New(c, term)
	if _, err := w.Set(term.Context(), "orders/owner", []byte("replica-1"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}
	s, err := leader.Leader(ctx, c, "orders/leader")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leader %s at %s\n", s.ID, s.Value)
	if err := term.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(term.Err())
	// Output:
	// leader replica-1 at 10.0.0.5:8080
	// lock: released
}

// An Elector runs the work whenever this candidate leads, campaigns again
// after a loss, and serves a health check.
func ExampleElector_Run() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "replica-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	e, err := leader.NewElector(c, "orders/leader", []byte("10.0.0.5:8080"),
		leader.WithTTL(5*time.Second),
		leader.OnStartedLeading(func(t *leader.Term) { fmt.Println("started leading") }),
		leader.OnStoppedLeading(func(err error) { fmt.Println("stopped leading:", err) }))
	if err != nil {
		log.Fatal(err)
	}
	// http.Handle("/healthz", e) serves e.Check.
	err = e.Run(ctx, func(ctx context.Context, t *leader.Term) error {
		fmt.Println("working; healthy:", e.Check() == nil)
		return nil // done: Run resigns and returns
	})
	fmt.Println("Run:", err)
	// Output:
	// started leading
	// working; healthy: true
	// stopped leading: lock: released
	// Run: <nil>
}

// Observe reports who leads, and each change.
func ExampleObserve() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "watcher"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	octx, stop := context.WithCancel(ctx)
	changes, err := leader.Observe(octx, c, "orders/leader")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leading:", (<-changes).HasLeader())
	term, err := leader.Campaign(ctx, c, "orders/leader", []byte("10.0.0.5:8080"), leader.WithCandidateID("replica-1"))
	if err != nil {
		log.Fatal(err)
	}
	s := <-changes
	fmt.Println("leader:", s.ID, string(s.Value), s.Token == term.Token())
	_ = term.Resign(ctx)
	fmt.Println("leading:", (<-changes).HasLeader())
	stop()
	// Output:
	// leading: false
	// leader: replica-1 10.0.0.5:8080 true
	// leading: false
}

// A Group splits the leadership of four shards between the replicas that
// run: alone, replica-1 leads all four; once replica-2 has joined, each
// leads two, handed over shard by shard.
func ExampleGroup_Run() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shards := []string{"orders/shard-0", "orders/shard-1", "orders/shard-2", "orders/shard-3"}

	started := make(chan string, 8)
	work := func(ctx context.Context, t *leader.Term) error {
		started <- t.Election()
		<-ctx.Done() // serve the shard until it is handed over or the term ends
		return nil
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	join := func(id string) *leader.Group {
		c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id})
		if err != nil {
			log.Fatal(err)
		}
		g, err := leader.NewGroup(c, "orders/replicas", shards, []byte(id), leader.WithCandidateID(id))
		if err != nil {
			log.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			_ = g.Run(ctx, work) // until ctx ends: resigns, leaves the group
		})
		return g
	}

	r1 := join("replica-1")
	for range 4 {
		<-started
	}
	fmt.Println("replica-1 leads", r1.Leading())
	r2 := join("replica-2")
	for range 2 { // replica-2's works start once replica-1 has resigned
		<-started
	}
	fmt.Println("replica-1 leads", r1.Leading())
	fmt.Println("replica-2 leads", r2.Leading())
	cancel()
	// Output:
	// replica-1 leads [orders/shard-0 orders/shard-1 orders/shard-2 orders/shard-3]
	// replica-1 leads [orders/shard-0 orders/shard-1]
	// replica-2 leads [orders/shard-2 orders/shard-3]
}

// A rolling upgrade: the new version campaigns with a higher priority; the
// old leader's work context ends, and once its work has returned the term
// goes to the new version at once, nobody in between.
func ExampleWithPriority() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(id string) *sskv.Client {
		c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: id})
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	v1, v2 := dial("app-v1"), dial("app-v2")
	defer v1.Close()
	defer v2.Close()

	old, err := leader.Campaign(ctx, v1, "app/leader", []byte("v1"), leader.WithCandidateID("app-v1"), leader.WithPriority(1))
	if err != nil {
		log.Fatal(err)
	}
	elected := make(chan *leader.Term)
	go func() {
		t, err := leader.Campaign(ctx, v2, "app/leader", []byte("v2"), leader.WithCandidateID("app-v2"), leader.WithPriority(2))
		if err != nil {
			log.Fatal(err)
		}
		elected <- t
	}()
	<-old.Context().Done() // the old leader's work stops...
	fmt.Println(context.Cause(old.Context()))
	if err := old.Resign(ctx); err != nil { // ...and, once it has, hands over
		log.Fatal(err)
	}
	term := <-elected
	fmt.Println("leader", term.CandidateID(), "after", old.CandidateID())
	_ = term.Resign(ctx)
	// Output:
	// leader: leadership is being transferred to "app-v2"
	// leader app-v2 after app-v1
}
