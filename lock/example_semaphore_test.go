package lock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// At most two replicas upgrade their firmware at once: each holds one of
// the semaphore's two slots while it works, and writes its progress fenced
// with the slot's token, so that a replica that lost its slot (paused past
// its renew deadline, say) cannot overwrite the record of the slot's next
// holder.
func ExampleSemaphore() {
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

	var replicas []*lock.Semaphore
	for _, id := range []string{"replica-a", "replica-b", "replica-c"} {
		s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: "fleet/firmware", Limit: 2, HolderID: id, TTL: 5 * time.Second})
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close(context.Background())
		replicas = append(replicas, s)
	}
	for _, s := range replicas {
		ok, err := s.TryAcquire(ctx) // Acquire would wait for a slot
		if err != nil {
			log.Fatal(err)
		}
		if !ok {
			fmt.Println(s.HolderID(), "waits: both slots are taken")
			continue
		}
		// The work: s.Context() ends if the slot is lost.
		w := fenced.New(c, s)
		key := fmt.Sprintf("fleet/firmware/slot%d", s.Slot())
		if _, err := w.Set(s.Context(), key, []byte(s.HolderID()+" upgrading"), sskv.SetOptions{}); err != nil {
			log.Fatal(err)
		}
		fmt.Println(s.HolderID(), "upgrades")
	}
	// Release only once the work has returned.
	if err := replicas[0].Release(ctx); err != nil {
		log.Fatal(err)
	}
	ok, _ := replicas[2].TryAcquire(ctx)
	fmt.Println("after a's release, c acquires:", ok, "limit", replicas[2].Limit())
	// Output:
	// replica-a upgrades
	// replica-b upgrades
	// replica-c waits: both slots are taken
	// after a's release, c acquires: true limit 2
}
