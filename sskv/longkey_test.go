package sskv_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A watch of a key too long to be notified of fails at once with
// ErrKeyTooLong and sends nothing; the client carries on. The longest key
// the client can watch is watched, and its changes arrive. (A 40,000-byte
// election name used to take the whole client offline for good.)
func TestWatchKeyTooLong(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	max := c.MaxWatchKey()
	if want := (65535 - 58 - 1 - 2*len(c.ID()) - 16) / 2; max != want {
		t.Fatalf("MaxWatchKey = %d with a client id of %d bytes; want %d", max, len(c.ID()), want)
	}
	ctx := testCtx(t)
	long := strings.Repeat("k", max+1)
	before := srv.Requests(c.ID())
	for _, watch := range []func() error{
		func() error { _, err := c.Watch(ctx, long); return err },
		func() error { _, err := c.Watch(ctx, long, sskv.Detached()); return err },
		func() error { _, err := c.Watch(ctx, long, sskv.WithCallback(func(sskv.Event) {}, nil)); return err },
	} {
		if err := watch(); !errors.Is(err, sskv.ErrKeyTooLong) {
			t.Fatalf("watch of a %d-byte key = %v; want ErrKeyTooLong", len(long), err)
		}
	}
	if n := srv.Requests(c.ID()) - before; n != 0 {
		t.Fatalf("%d requests sent for watches of a key too long", n)
	}

	longest := strings.Repeat("k", max)
	w, err := c.Watch(ctx, longest)
	if err != nil {
		t.Fatalf("watch of the longest key: %v", err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	if _, err := c.Set(ctx, longest, []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.Events():
		if ev.Op != sskv.OpSet || string(ev.Value) != "v" {
			t.Fatalf("event %+v; want the SET", ev)
		}
	case <-time.After(waitTimeout):
		t.Fatal("no notification of the longest key's SET")
	}
	if _, err := c.Get(ctx, "other"); err != nil {
		t.Fatalf("Get after: %v", err)
	}
}
