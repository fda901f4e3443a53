package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// queuedRW runs acquire (m's RLock or Lock) in the background and returns
// once the gate's holder has answered m's join: m waits in the gate's
// queue (as queuedLock).
func queuedRW(t *testing.T, observer *sskv.Client, m *lock.RWMutex, acquire func(context.Context) error) <-chan error {
	t.Helper()
	ctx := testCtx(t)
	told, err := observer.Watch(ctx, lock.RWMutexGate(m.Config().Name)+"\x00inbox\x00"+m.Config().HolderID)
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, told)
	defer told.Stop()
	got := make(chan error, 1)
	go func() { got <- acquire(ctx) }()
	for {
		select {
		case ev, ok := <-told.Events():
			if !ok {
				t.Fatalf("the watch of %s's inbox ended: %v", m.Config().HolderID, told.Err())
			}
			if ev.Op == sskv.OpSet && len(ev.Value) > 0 && ev.Value[0] != '+' && ev.Value[0] != '*' {
				return got
			}
		case <-time.After(waitTimeout):
			t.Fatalf("the gate's holder did not answer %s's join", m.Config().HolderID)
		}
	}
}

// A reader whose client has just reconnected is first at the gate when a
// writer releases it: the gate is reserved for it, and it takes it within
// its hold-off (a reservation may be taken then). But its slots are held
// off for a TTL from the reconnect (TryLock, Lock.wait), so it holds the
// gate, with every slot free, until then: the writer queued behind it,
// whose connection had no outage, waits the rest of that TTL. The
// Semaphore's gate holder leaves the gate in this case (9298886, "a gate
// holder held off after a reconnect leaves the gate while a slot is free");
// the RWMutex's reader does not.
func TestReviewRWMutexHeldOffReaderHoldsGate(t *testing.T) {
	const ttl = 4 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 2, TTL: ttl}
	// w keeps the gate's queue: it waited for the gate itself.
	w0 := newRW(t, dial(t, srv.Addr()), cfg)
	if err := w0.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	observer := dial(t, srv.Addr())
	wc := dial(t, srv.Addr())
	w := newRW(t, wc, cfg)
	wgot := make(chan error, 1)
	go func() { wgot <- w.Lock(ctx) }()
	waitFor(t, "w to wait at the gate", func() bool {
		return srv.Watching(wc.ID(), lock.RWMutexGate("m")+"\x00inbox\x00"+w.Config().HolderID)
	})
	if err := w0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-wgot; err != nil {
		t.Fatal(err)
	}
	rc := dial(t, srv.Addr())
	r := newRW(t, rc, cfg)
	rgot := queuedRW(t, observer, r, r.RLock)
	inbox := lock.RWMutexGate("m") + "\x00inbox\x00" + r.Config().HolderID
	before, err := rc.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kick(rc.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader to reconnect", func() bool {
		cn, err := rc.Connection(ctx)
		return err == nil && cn != before && srv.Watching(rc.ID(), inbox)
	})
	kicked := time.Now()
	w2 := newRW(t, dial(t, srv.Addr()), cfg)
	w2got := queuedRW(t, observer, w2, w2.Lock)
	released := time.Now()
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reader to take the gate reserved for it", func() bool {
		res, err := observer.Get(ctx, lock.RWMutexGate("m"))
		return err == nil && res.Found && lock.ParseHolder(res.Value, res.Version).ID == r.Config().HolderID
	})
	t.Logf("the reader holds the gate %v after the release", time.Since(released).Round(time.Millisecond))
	// The reader reads as soon as it may, and leaves.
	go func() {
		if err := <-rgot; err == nil {
			_ = r.RUnlock(ctx)
		}
	}()
	if err := <-w2got; err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	t.Logf("second writer in %v after the release (reader reconnected %v before it; TTL %v)", took.Round(time.Millisecond), released.Sub(kicked).Round(time.Millisecond), ttl)
	if took > ttl/2 {
		t.Errorf("the second writer waited %v with every slot free, behind a reader held off after a reconnect", took.Round(time.Millisecond))
	}
}

// The writer's side: a writer holding the gate waits for a reader (drain,
// a racing Lock of the reader's slot); its client reconnects; the reader
// leaves at once. The writer's gate is confirmed after the reconnect (so
// no store restart lost the keys), yet its wait for the slot holds off a
// TTL from the reconnect before it takes the slot it only needs to see
// free: the writer, and everyone queued behind the gate, wait that long.
func TestReviewRWMutexHeldOffWriterWaitsOutTTL(t *testing.T) {
	// Left as it is: the writer could skip its hold-off only by taking its
	// confirmed gate as proof that the store kept the readers' slots too,
	// which a store that loses its last writes in a restart (while it kept
	// the older gate) would break: a reader whose slot vanished still counts
	// on it until its renew deadline. The hold-off costs a TTL, once.
	t.Skip("known (liveness): a draining writer whose client reconnected waits out its hold-off for a slot its reader has released")
	const ttl = 4 * time.Second
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.RWMutexConfig{Name: "m", MaxReaders: 1, TTL: ttl}
	r := newRW(t, dial(t, srv.Addr()), cfg)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wc := dial(t, srv.Addr())
	w := newRW(t, wc, cfg)
	got := make(chan error, 1)
	go func() { got <- w.Lock(ctx) }()
	waitFor(t, "the writer to wait for the reader", func() bool { return srv.Watching(wc.ID(), lock.RWMutexReader("m", 0)) })
	before, err := wc.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Kick(wc.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the writer to reconnect and watch the slot again", func() bool {
		cn, err := wc.Connection(ctx)
		return err == nil && cn != before && srv.Watching(wc.ID(), lock.RWMutexReader("m", 0))
	})
	released := time.Now()
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	took := time.Since(released)
	t.Logf("writer in %v after the reader left (TTL %v)", took.Round(time.Millisecond), ttl)
	if took > ttl/2 {
		t.Errorf("the writer waited %v for a slot its reader had released, held off after its reconnect", took.Round(time.Millisecond))
	}
}
