package lock_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/dsslock/dsslock/internal/storetest"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// acquire calls lock.Acquire and closes the Lock it returns at the end of
// the test.
func acquire(ctx context.Context, t testing.TB, c *sskv.Client, cfg lock.Config) (*lock.Lock, error) {
	l, err := lock.Acquire(ctx, c, cfg)
	if l != nil {
		t.Cleanup(func() { _ = l.Close(context.Background()) })
	}
	return l, err
}

// Acquire returns a Lock that holds the key, waits while someone else
// holds it (with and without Race), and takes it when it is released, with
// a greater token.
func TestAcquire(t *testing.T) {
	for _, race := range []bool{false, true} {
		name := "queued"
		if race {
			name = "Race"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			cfg := lock.Config{Name: "l", TTL: 2 * time.Second, FenceKey: true, Race: race, Value: []byte("v")}
			first, err := acquire(ctx, t, dial(t, srv.Addr()), cfg)
			if err != nil {
				t.Fatalf("Acquire of a free lock: %v", err)
			}
			if first.Err() != nil {
				t.Fatalf("Acquire returned a Lock that does not hold: %v", first.Err())
			}
			c := dial(t, srv.Addr())
			got := make(chan *lock.Lock, 1)
			go func() {
				l, err := acquire(ctx, t, c, cfg)
				if err != nil {
					t.Errorf("Acquire of a held lock: %v", err)
				}
				got <- l
			}()
			key := "l"
			if !race {
				waitFor(t, "the second to wait", func() bool { return srv.Requests(c.ID()) >= 3 })
			} else {
				waitFor(t, "the second to watch the key", func() bool { return srv.Watching(c.ID(), key) })
			}
			select {
			case <-got:
				t.Fatal("Acquire returned while the lock was held")
			default:
			}
			if err := first.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			second := <-got
			if second == nil {
				t.FailNow()
			}
			if second.Err() != nil || !first.Token().Before(second.Token()) {
				t.Fatalf("second holding: err %v, token %v after %v; want held with a greater token", second.Err(), second.Token(), first.Token())
			}
			h := holder(t, second)
			if h.ID != second.HolderID() || string(h.Value) != "v" {
				t.Errorf("the key holds %+v; want the second's id and value", h)
			}
		})
	}
}

// The Lock Acquire returns writes the HolderID it was given, or a default
// one made of the client's id; its holder reads it.
func TestAcquireHolderID(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	for i, id := range []string{"", "me"} {
		l, err := acquire(ctx, t, c, lock.Config{Name: fmt.Sprint("l", i), Race: true, HolderID: id})
		if err != nil {
			t.Fatal(err)
		}
		got := l.HolderID()
		if id != "" && got != id || id == "" && !strings.HasPrefix(got, c.ID()+"/") {
			t.Errorf("HolderID() = %q given %q; want the given one, or the client's id, a slash and more", got, id)
		}
		if h := holder(t, l); h.ID != got || l.Config().HolderID != got {
			t.Errorf("the key holds %q and Config has %q; want %q", h.ID, l.Config().HolderID, got)
		}
	}
}

// Acquire with a context that ends while the lock is held returns the
// context's error and holds nothing; with bad input it returns ErrConfig.
func TestAcquireFails(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "l", TTL: 2 * time.Second, FenceKey: true, Race: true}
	if _, err := acquire(ctx, t, dial(t, srv.Addr()), cfg); err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	for _, race := range []bool{true, false} {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		cfg := cfg
		cfg.Race = race
		l, err := lock.Acquire(short, c, cfg)
		cancel()
		if l != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire (Race %v) until its context ends = %v, %v; want nil and DeadlineExceeded", race, l, err)
		}
	}
	for _, tc := range []struct {
		c   *sskv.Client
		cfg lock.Config
	}{
		{nil, cfg},
		{c, lock.Config{Race: true}},
		{c, lock.Config{}}, // without Race too
		{c, lock.Config{Name: "l", Race: true, Value: []byte("v")}}, // Value needs FenceKey
		{c, lock.Config{Name: "l", Race: true, TTL: -time.Second}},
	} {
		if l, err := lock.Acquire(ctx, tc.c, tc.cfg); l != nil || !errors.Is(err, lock.ErrConfig) {
			t.Errorf("Acquire(%v, %+v) = %v, %v; want ErrConfig", tc.c, tc.cfg, l, err)
		}
	}
}

// An acquisition whose answer is lost when Acquire's context ends is given
// back: the key does not stay held until it expires.
func TestAcquireGivesBackAnUnknownAcquisition(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := "plain"
		if fence {
			name = "FenceKey"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			w, err := dial(t, srv.Addr()).Watch(ctx, "l")
			if err != nil {
				t.Fatal(err)
			}
			storetest.SkipInitial(t, w)
			defer w.Stop()
			c := dial(t, srv.Addr())
			srv.SetResponseFault(c.ID(), localstore.ResponseFault{Delay: 2 * time.Second})
			short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			l, err := lock.Acquire(short, c, lock.Config{Name: "l", TTL: time.Minute, FenceKey: fence, Race: true})
			if l != nil || err == nil {
				t.Fatalf("Acquire with its answers delayed past its context = %v, %v; want an error", l, err)
			}
			// The store applied the SET (its answer came too late), and the
			// key is deleted long before its TTL.
			set := false
			for {
				select {
				case ev := <-w.Events():
					switch {
					case ev.Op == sskv.OpSet:
						set = true
					case set:
						return // deleted after it was taken
					}
				case <-ctx.Done():
					t.Fatalf("the key was not given back (taken: %v)", set)
				}
			}
		})
	}
}

// A racing waiter that hears nothing checks the lock anyway after about 10
// TTLs: the safeguard against a notification lost in a way the client
// could not detect. Each waiter, asleep while the holder renews, sends a
// request on its own, and goes back to sleep (the key is held).
func TestRacingWaiterRechecks(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const ttl = 500 * time.Millisecond
	cfg := lock.Config{Name: "l", TTL: ttl, FenceKey: true, Race: true}
	if _, err := acquire(ctx, t, dial(t, srv.Addr()), cfg); err != nil {
		t.Fatal(err)
	}
	// Two waiters through Acquire on one client, two Lock calls on another.
	a, b := dial(t, srv.Addr()), dial(t, srv.Addr())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 4)
	for range 2 {
		go func() {
			_, err := acquire(wctx, t, a, cfg)
			done <- err
		}()
		go func() { done <- newLock(t, b, cfg).Lock(wctx) }()
	}
	defer func() {
		cancel()
		for range 4 {
			<-done
		}
	}()
	waitFor(t, "the waiters to watch the key", func() bool {
		return srv.Watching(a.ID(), "l") && srv.Watching(b.ID(), "l")
	})
	// Each waiter has sent its attempt, its watch and the attempt after
	// it within a round trip or two; its recheck comes 10.5 to 11 TTLs
	// after its last attempt. Count from halfway.
	<-time.After(5 * ttl)
	na, nb := srv.Requests(a.ID()), srv.Requests(b.ID())
	start := time.Now()
	waitFor(t, "each waiter to check the lock on its own", func() bool {
		return srv.Requests(a.ID()) >= na+2 && srv.Requests(b.ID()) >= nb+2
	})
	t.Logf("rechecks after %v (TTL %v)", time.Since(start), ttl)
	select {
	case err := <-done:
		t.Fatalf("a waiter returned while the lock was held: %v", err)
	default:
	}
}
