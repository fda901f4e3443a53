package faultproxy_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A test puts the proxy between a client and the broker, here a local store
// (the address of a real broker works the same), and partitions them.
func Example() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	p, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: p.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}

	p.Blackhole() // the path goes dead; the connection stays open
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = c.Get(short, "k")
	cancelShort()
	fmt.Println("while blackholed:", errors.Is(err, context.DeadlineExceeded))

	p.Heal()
	res, err := c.Get(ctx, "k")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("after Heal: %s\n", res.Value)
	// Output:
	// while blackholed: true
	// after Heal: v
}

// With a delay, every request and its response take that much longer each.
func ExampleProxy_SetDelay() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	p, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: p.Addr()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	p.SetDelay(50 * time.Millisecond)
	begin := time.Now()
	if _, err := c.Get(ctx, "k"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("round trip of at least 100ms:", time.Since(begin) >= 100*time.Millisecond)
	p.SetDelay(0)
	// Output: round trip of at least 100ms: true
}
