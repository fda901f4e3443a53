package sskv_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func Example() {
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

	if _, err := c.Set(ctx, "greeting", []byte("hello"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}
	res, err := c.Get(ctx, "greeting")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s found=%v\n", res.Value, res.Found)
	// Output: hello found=true
}

// A lease: take it if free, renew it while holding it, and use its version
// as the fencing token of the writes it protects.
func ExampleClient_Set_lease() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	take := sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: 10 * time.Second}
	lease, err := c.Set(ctx, "lease", []byte("worker-1"), take)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("lease taken:", lease.Applied)

	_, err = c.Set(ctx, "data", []byte("v1"), sskv.SetOptions{FencingToken: lease.Version})
	fmt.Println("fenced write:", err)

	stale := lease.Version
	renewed, err := c.Set(ctx, "lease", []byte("worker-1"), take) // renewal: a newer version
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Set(ctx, "data", []byte("v2"), sskv.SetOptions{FencingToken: renewed.Version}); err != nil {
		log.Fatal(err)
	}
	_, err = c.Set(ctx, "data", []byte("late"), sskv.SetOptions{FencingToken: stale})
	fmt.Println("write with the stale token refused:", errors.Is(err, sskv.ErrFencingTokenLower))

	other, err := c.Set(ctx, "lease", []byte("worker-2"), take)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("another worker takes it:", other.Applied)
	// Output:
	// lease taken: true
	// fenced write: <nil>
	// write with the stale token refused: true
	// another worker takes it: false
}

func ExampleClient_Watch() {
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

	_, _ = c.Set(ctx, "setpoint", []byte("20.0"), sskv.SetOptions{})
	w, err := c.Watch(ctx, "setpoint")
	if err != nil {
		log.Fatal(err)
	}
	defer w.Stop()

	// The first event is the state the watch starts from; then each change.
	_, _ = c.Set(ctx, "setpoint", []byte("21.5"), sskv.SetOptions{})
	_, _ = c.Del(ctx, "setpoint", sskv.DelOptions{})
	for i := 0; i < 3; i++ {
		ev := <-w.Events()
		fmt.Printf("%s %s %q initial=%v\n", ev.Op, ev.Key, ev.Value, ev.Initial)
	}
	// Output:
	// SET setpoint "20.0" initial=true
	// SET setpoint "21.5" initial=false
	// DELETE setpoint "" initial=false
}

func ExampleServiceError() {
	srv, err := localstore.Start(localstore.Config{KeyPrefixes: map[string][]string{"": {"app/"}}})
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

	_, err = c.Get(ctx, "other/key")
	var se *sskv.ServiceError
	fmt.Println(errors.Is(err, sskv.ErrNotAuthorized), errors.As(err, &se), se.Message)
	// Output: true true not authorized
}

// A callback watch: no channel to read and no goroutine of its own. The
// function gets the state the watch starts from (here: no key), then each
// change in order, and must return quickly.
func ExampleWithCallback() {
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

	changes := make(chan string, 16)
	ended := make(chan error, 1)
	w, err := c.Watch(ctx, "config", sskv.WithCallback(func(ev sskv.Event) {
		changes <- fmt.Sprintf("%v %q initial=%v", ev.Op, ev.Value, ev.Initial) // never blocks: the channel has room
	}, func(err error) { ended <- err }))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Set(ctx, "config", []byte("v1"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Del(ctx, "config", sskv.DelOptions{}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-changes)
	fmt.Println(<-changes)
	fmt.Println(<-changes)
	w.Stop()
	fmt.Println("ended:", <-ended)
	// Output:
	// DELETE "" initial=true
	// SET "v1" initial=false
	// DELETE "" initial=false
	// ended: <nil>
}
