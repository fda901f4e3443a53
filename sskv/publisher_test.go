package sskv_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A request waiting for the broker's PUBACK costs no goroutine of the
// client's: n requests written to a frozen connection cost n goroutines
// (their callers') and a few, not 2n. When the path heals they are all
// answered, and the client's publisher goes idle.
func TestRequestsInFlightCostNoGoroutine(t *testing.T) {
	const n = 200
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) { cfg.KeepAlive = 60 * time.Second })
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	storetest.Eventually(t, "the publisher to go idle", func() bool {
		st := sskv.PublisherStateForTest(c)
		return !st.Running && st.Tracked == 0
	})
	base := runtime.NumGoroutine()

	p.Blackhole()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g, err := c.Get(ctx, "k"); err != nil || string(g.Value) != "v" {
				errs <- errors.Join(err, errors.New("Get: wrong answer "+string(g.Value)))
			}
		}()
	}
	storetest.Eventually(t, "every request to be written, unacknowledged", func() bool {
		return sskv.PublisherStateForTest(c).Tracked == n
	})
	got := runtime.NumGoroutine() - base
	t.Logf("%d requests unacknowledged on a frozen connection: %d goroutines more than before (%d callers)", n, got, n)
	if got > n+10 {
		t.Errorf("%d requests in flight cost %d goroutines, want at most %d (their callers and a few)", n, got, n+10)
	}

	p.Heal()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	storetest.Eventually(t, "the publisher to go idle after the PUBACKs", func() bool {
		st := sskv.PublisherStateForTest(c)
		return !st.Running && st.Tracked == 0 && st.Queued == 0
	})
}

// A request still waiting to be written when its caller gives up is never
// sent: here the write before it is stuck on a frozen connection, the
// caller's deadline passes, and after the path heals the store has not
// executed it.
func TestQueuedRequestNotSentAfterCallerGivesUp(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{BufferSize: 32 << 10})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) { cfg.KeepAlive = 60 * time.Second })
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}

	p.Blackhole()
	// Large SETs until the writer is stuck writing one of them, with
	// more waiting: the socket and the proxy hold far less than 32 MiB.
	// "Stuck" is an absence (no request taken for 100 ms), so it takes a
	// wait of that long.
	big := bytes.Repeat([]byte("x"), 1<<20)
	var wg sync.WaitGroup
	bigErrs := make(chan error, 32)
	for i := 0; ; i++ {
		if st := sskv.PublisherStateForTest(c); st.Queued >= 2 {
			time.Sleep(100 * time.Millisecond)
			if sskv.PublisherStateForTest(c).Sends == st.Sends {
				break
			}
		}
		if i == 32 {
			t.Fatal("32 MiB of requests written to a frozen connection without blocking")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Set(ctx, "big", big, sskv.SetOptions{}); err != nil {
				bigErrs <- err
			}
		}()
		storetest.Eventually(t, "the large SET to reach the publisher", func() bool {
			st := sskv.PublisherStateForTest(c)
			return st.Sends+uint64(st.Queued) >= uint64(i)+2 // the first SET, and this one
		})
	}
	before := sskv.PublisherStateForTest(c)

	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Set(lctx, "late", []byte("v"), sskv.SetOptions{})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Set behind a stuck write: %v, want a timeout", err)
	}
	after := sskv.PublisherStateForTest(c)
	if after.Sends != before.Sends {
		t.Fatalf("the writer was not stuck: it took %d more requests while the late one waited", after.Sends-before.Sends)
	}
	if after.Dropped != before.Dropped+1 {
		t.Errorf("dropped %d requests while the late one waited, want 1", after.Dropped-before.Dropped)
	}

	p.Heal()
	wg.Wait()
	close(bigErrs)
	for err := range bigErrs {
		t.Fatalf("a large SET failed after the path healed: %v", err)
	}
	// Every request sent before the late one has been answered; one more
	// round trip for good measure.
	if _, err := c.Set(ctx, "after", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	g, err := c.Get(ctx, "late")
	if err != nil {
		t.Fatal(err)
	}
	if g.Found {
		t.Fatal("the store executed a request whose caller gave up before it was sent")
	}
}
