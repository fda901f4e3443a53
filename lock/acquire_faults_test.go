package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A FenceKey Acquire that waited and won hands its watch to the guard: a
// delete of the key by someone else loses the holding at once (not at the
// next renewal, a minute TTL away), and the watch ends with the holding.
func TestAcquireGuardTakesWaitWatch(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "l", TTL: time.Minute, FenceKey: true, Race: true}
	first, err := acquire(ctx, t, dial(t, srv.Addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	got := make(chan *lock.Lock, 1)
	go func() {
		l, err := acquire(ctx, t, c, cfg)
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- l
	}()
	waitFor(t, "the waiter to watch", func() bool { return srv.Watching(c.ID(), "l") })
	// Its attempt and its watch (KEYNOTIFY and the read that starts it).
	waitFor(t, "the waiter's watch", func() bool { return srv.Requests(c.ID()) >= 3 })
	before := srv.Requests(c.ID())
	t.Logf("the waiter sent %d requests before the release", before)
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	// SET NEX + fenced SET, and one more (3 on the base commit d34eef0
	// with New+Lock too); no new KEYNOTIFY for the guard.
	if n := srv.Requests(c.ID()) - before; n > 3 {
		t.Errorf("the winner sent %d requests after the release; want at most 3 (the guard goes on with the wait's watch)", n)
	}
	if !srv.Watching(c.ID(), "l") {
		t.Fatal("the holding does not watch its key")
	}
	admin := dial(t, srv.Addr())
	if _, err := admin.Del(ctx, "l", sskv.DelOptions{FencingToken: srv.Now()}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if !errors.Is(l.Err(), lock.ErrKeyLost) {
			t.Errorf("Err = %v; want ErrKeyLost", l.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the delete of the held key did not end the holding: the guard has no watch")
	}
	_ = l.Unlock(ctx)
	waitFor(t, "the guard's watch to end", func() bool { return !srv.Watching(c.ID(), "l") })
}

// An Acquire whose first attempt's answer is lost (the key is free, and its
// SET applied) keeps that Lock: the next attempt gives the record back
// (FenceKey) and takes the key; the Lock returned holds it, with its guard.
func TestAcquireUnknownThenWins(t *testing.T) {
	for _, fence := range []bool{false, true} {
		t.Run(fmt.Sprint("fence=", fence), func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			c := dial(t, srv.Addr())
			cfg := lock.Config{Name: "l", TTL: time.Second, FenceKey: fence, Race: true}
			srv.SetResponseFault(c.ID(), localstore.ResponseFault{Drop: true})
			n := srv.Requests(c.ID())
			got := make(chan error, 1)
			var l *lock.Lock
			go func() {
				var err error
				l, err = acquire(ctx, t, c, cfg)
				got <- err
			}()
			waitFor(t, "the first SET", func() bool { return srv.Requests(c.ID()) > n })
			srv.SetResponseFault(c.ID(), localstore.ResponseFault{})
			if err := <-got; err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if l.Err() != nil {
				t.Fatalf("Acquire returned a Lock not held: %v", l.Err())
			}
			h := holder(t, l)
			if h.ID != l.HolderID() {
				t.Fatalf("key holds %+v; want %s", h, l.HolderID())
			}
			if fence && !h.Token.IsZero() && h.Token != l.Token() {
				t.Errorf("key token %v; Lock's %v", h.Token, l.Token())
			}
			// Still held several TTLs later: the renewals work.
			select {
			case <-l.Done():
				t.Fatalf("lost: %v", l.Err())
			case <-time.After(3 * cfg.TTL):
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "no watch left", func() bool { return !srv.Watching(c.ID(), "l") })
		})
	}
}

// Many Acquire calls on one client (Race, FenceKey) and many Lock calls on
// another: each in turn holds alone, and every one of them gets the lock.
func TestAcquireManyOnOneClient(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "l", TTL: 2 * time.Second, FenceKey: true, Race: true}
	a, b := dial(t, srv.Addr()), dial(t, srv.Addr())
	const n = 12
	var holders atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	work := func(l *lock.Lock) {
		if k := holders.Add(1); k != 1 {
			errs <- fmt.Errorf("%d holders at once", k)
		}
		h, err := l.Holder(ctx)
		if err != nil || h.ID != l.HolderID() {
			errs <- fmt.Errorf("holder %+v, %v; want %s", h, err, l.HolderID())
		}
		<-time.After(5 * time.Millisecond)
		holders.Add(-1)
		if err := l.Unlock(ctx); err != nil {
			errs <- err
		}
	}
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c := cfg
			c.HolderID = fmt.Sprint("a", i)
			l, err := acquire(ctx, t, a, c)
			if err != nil {
				errs <- err
				return
			}
			work(l)
		}()
		go func() {
			defer wg.Done()
			c := cfg
			c.HolderID = fmt.Sprint("b", i)
			l, err := lock.New(b, c)
			if err != nil {
				errs <- err
				return
			}
			defer l.Close(context.Background())
			if err := l.Lock(ctx); err != nil {
				errs <- err
				return
			}
			work(l)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitFor(t, "no watch left", func() bool { return !srv.Watching(a.ID(), "l") && !srv.Watching(b.ID(), "l") })
}

// A waiting Acquire whose context ends stops its watch; with a closed
// client it returns ErrClosed; with a Value too large, the store's/client's
// refusal, at once.
func TestAcquireErrors(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.Config{Name: "l", TTL: 2 * time.Second, FenceKey: true, Race: true}
	if _, err := acquire(ctx, t, dial(t, srv.Addr()), cfg); err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	wctx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		_, err := acquire(wctx, t, c, cfg)
		got <- err
	}()
	waitFor(t, "the waiter to watch", func() bool { return srv.Watching(c.ID(), "l") })
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire after cancel = %v; want Canceled", err)
	}
	waitFor(t, "the watch to end", func() bool { return !srv.Watching(c.ID(), "l") })

	// Compare Acquire and New+Lock on the same inputs.
	cc := dial(t, srv.Addr())
	_ = cc.Close()
	done, dcancel := context.WithCancel(ctx)
	dcancel()
	big := cfg
	big.Name = "big"
	big.Value = make([]byte, 1<<22)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		c    *sskv.Client
		cfg  lock.Config
	}{
		{"closed client", ctx, cc, cfg},
		{"ended ctx", done, c, cfg},
		{"too large", ctx, c, big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tctx, tcancel := context.WithTimeout(tc.ctx, 5*time.Second)
			defer tcancel()
			_, aerr := acquire(tctx, t, tc.c, tc.cfg)
			var lerr error
			if l, err := lock.New(tc.c, tc.cfg); err != nil {
				lerr = err
			} else {
				lerr = l.Lock(tctx)
				_ = l.Close(context.Background())
			}
			for _, target := range []error{sskv.ErrClosed, context.Canceled, context.DeadlineExceeded, sskv.ErrTooLarge, lock.ErrConfig, lock.ErrClosed} {
				if errors.Is(aerr, target) != errors.Is(lerr, target) {
					t.Errorf("errors.Is(_, %v): Acquire %v (%v), Lock %v (%v)", target, errors.Is(aerr, target), aerr, errors.Is(lerr, target), lerr)
				}
			}
			t.Logf("Acquire: %v; Lock: %v", aerr, lerr)
		})
	}
}
