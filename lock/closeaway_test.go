package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Close does not wait for a store that is away. Two FenceKey Locks take
// turns through the queue, so both have one to leave; then the store shuts
// down, and Close (with no deadline of its own) returns at once: what it
// would have deleted expires within its TTL. It used to wait for a
// reconnection, up to the client's RequestTimeout per request.
func TestCloseDoesNotWaitForAStoreThatIsAway(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	var locks []*lock.Lock
	for _, id := range []string{"a", "b"} {
		locks = append(locks, newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", HolderID: id, TTL: time.Second, FenceKey: true}))
	}
	a, b := locks[0], locks[1]
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx) }()
	// b joins the queue by writing to a's inbox.
	admin := dial(t, srv.Addr())
	storetest.Eventually(t, "b to join the queue", func() bool {
		res, err := admin.Get(ctx, "l\x00inbox\x00a")
		return err == nil && res.Found
	})
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = srv.Close()
	for _, l := range locks {
		start := time.Now()
		err := l.Close(context.Background())
		took := time.Since(start)
		t.Logf("%s: Close took %v (%v)", l.HolderID(), took, err)
		if took > 5*time.Second {
			t.Errorf("%s: Close with the store away took %v", l.HolderID(), took)
		}
	}
}

// The same for a Semaphore, whose slots are FenceKey Locks.
func TestSemaphoreCloseDoesNotWaitForAStoreThatIsAway(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	var sems []*lock.Semaphore
	var cs []*sskv.Client
	for _, id := range []string{"a", "b", "c"} {
		c := dial(t, srv.Addr())
		cs = append(cs, c)
		sems = append(sems, newSemaphore(t, c, lock.SemaphoreConfig{Name: "s", HolderID: id, Limit: 2, TTL: time.Second}))
	}
	for _, s := range sems[:2] {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 1)
	go func() { got <- sems[2].Acquire(ctx) }()
	// c holds the gate, and watches the slots.
	storetest.Eventually(t, "c to wait at the gate", func() bool {
		return srv.Watching(cs[2].ID(), lock.SemaphoreSlot("s", 0)) && srv.Watching(cs[2].ID(), lock.SemaphoreSlot("s", 1))
	})
	for _, s := range sems[:2] {
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	_ = srv.Close()
	for _, s := range sems {
		start := time.Now()
		err := s.Close(context.Background())
		took := time.Since(start)
		t.Logf("%s: Close took %v (%v)", s.HolderID(), took, err)
		if took > 5*time.Second {
			t.Errorf("%s: Close with the store away took %v", s.HolderID(), took)
		}
	}
}
