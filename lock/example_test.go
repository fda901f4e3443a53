package lock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// Guard a piece of work with a lock: it runs on one instance at a time, and
// its context ends if the lock is lost.
func Example() {
	srv, err := localstore.Start(localstore.Config{}) // or Dial a cluster's broker
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	l, err := lock.New(c, lock.Config{Name: "jobs/nightly", TTL: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if err := l.Lock(ctx); err != nil { // waits while another instance holds it
		log.Fatal(err)
	}
	work := func(ctx context.Context) error {
		// ... long work that checks ctx, and writes through fenced.New(c, l)
		return ctx.Err()
	}
	err = work(l.Context())
	// Release only once the work has returned.
	if uerr := l.Unlock(context.Background()); uerr != nil {
		log.Print(uerr)
	}
	fmt.Println("work:", err, "lock:", l.Err())
	// Output: work: <nil> lock: lock: released
}

// TryLock makes one attempt: an instance that finds the lock taken does
// something else.
func ExampleLock_TryLock() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	a, _ := lock.New(c, lock.Config{Name: "singleton", HolderID: "instance-a"})
	b, _ := lock.New(c, lock.Config{Name: "singleton", HolderID: "instance-b"})
	okA, _ := a.TryLock(ctx)
	okB, _ := b.TryLock(ctx)
	h, _ := b.Holder(ctx)
	fmt.Println("a:", okA, "b:", okB, "holder:", h.ID)
	_ = a.Unlock(ctx)
	// Output: a: true b: false holder: instance-a
}

// Acquire is New and Lock in one call: a standby instance waits until it
// holds the lock, keeping no Lock while it waits.
func ExampleAcquire() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	cfg := lock.Config{Name: "gateway/active", TTL: 5 * time.Second, Race: true}
	active, err := lock.Acquire(ctx, c, cfg)
	if err != nil {
		log.Fatal(err)
	}
	standby := make(chan *lock.Lock)
	go func() {
		l, err := lock.Acquire(ctx, c, cfg) // sleeps until the active one lets go
		if err != nil {
			log.Fatal(err)
		}
		standby <- l
	}()
	_ = active.Unlock(ctx)
	next := <-standby
	fmt.Println("standby holds:", next.Err() == nil, "newer token:", active.Token().Before(next.Token()))
	_ = next.Unlock(ctx)
	// Output: standby holds: true newer token: true
}

// Done tells the holder that it lost the lock; Err tells why.
func ExampleLock_Done() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	l, _ := lock.New(c, lock.Config{Name: "leader", TTL: time.Second})
	if err := l.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	c.Close() // the holder's connection is gone for good: renewals fail

	<-l.Done()
	fmt.Println(errors.Is(l.Err(), lock.ErrLost))
	// Output: true
}
