package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A holder writes through a Writer; once a newer holder has written, the
// old holder's writes are refused with ErrStale.
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

	old, _ := lock.New(c, lock.Config{Name: "lock", HolderID: "old"})
	if err := old.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	w := fenced.New(c, old)
	if _, err := w.Set(ctx, "config", []byte("v1"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}
	_ = old.Unlock(ctx)

	next, _ := lock.New(c, lock.Config{Name: "lock", HolderID: "next"})
	if err := next.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer next.Unlock(ctx)
	if _, err := fenced.New(c, next).Set(ctx, "config", []byte("v2"), sskv.SetOptions{}); err != nil {
		log.Fatal(err)
	}

	_, err = w.Set(ctx, "config", []byte("v1 again"), sskv.SetOptions{})
	fmt.Println(errors.Is(err, fenced.ErrStale))
	// Output: true
}
