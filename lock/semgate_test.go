package lock_test

import (
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A participant holding the semaphore's gate that is paused (its
// connection blackholed: to the store, a SIGSTOP looks the same) breaks
// neither the limit nor the wait of the others: a slot freed while it is
// paused goes to the waiter behind it once its lease of the gate has
// ended, and the paused one, back, waits for a slot of its own.
func TestSemaphorePausedGateHolder(t *testing.T) {
	srv := startStore(t)
	proxy := startProxy(t, srv.Addr())
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: time.Second}
	a := newSemaphore(t, dial(t, srv.Addr()), cfg)
	b := newSemaphore(t, dial(t, srv.Addr()), cfg)
	for _, s := range []*lock.Semaphore{a, b} {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	acquire := func(s *lock.Semaphore) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- s.Acquire(ctx) }()
		return ch
	}
	gc := dial(t, proxy.Addr())
	g := newSemaphore(t, gc, cfg)
	gotG := acquire(g)
	waitFor(t, "g to hold the gate and watch the slots", func() bool {
		return srv.Watching(gc.ID(), lock.SemaphoreSlot("s", 0)) && srv.Watching(gc.ID(), lock.SemaphoreSlot("s", 1))
	})
	wc := dial(t, srv.Addr())
	w := newSemaphore(t, wc, cfg)
	gotW := acquire(w)
	waitFor(t, "w to wait for the gate", func() bool { return srv.Watching(wc.ID(), "s\x00gate") })

	proxy.Blackhole()
	paused := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-gotW:
		if err != nil {
			t.Fatalf("w: Acquire: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("w did not acquire the slot freed while g, holding the gate, was paused")
	}
	t.Logf("w took slot %d %v after g was paused (TTL %v)", w.Slot(), time.Since(paused).Round(time.Millisecond), cfg.TTL)
	select {
	case err := <-gotG:
		t.Fatalf("g acquired (%v, slot %d) while b and w hold both slots", err, g.Slot())
	default:
	}
	if b.Err() != nil || w.Err() != nil {
		t.Fatalf("b or w does not hold: %v, %v", b.Err(), w.Err())
	}

	// g comes back: it waits until a slot is freed, then takes it.
	proxy.Heal()
	select {
	case err := <-gotG:
		t.Fatalf("g acquired (%v, slot %d) while b and w hold both slots", err, g.Slot())
	default:
	}
	freed := b.Slot()
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-gotG:
		if err != nil {
			t.Fatalf("g: Acquire: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("g did not acquire the slot b released")
	}
	if g.Slot() != freed || w.Err() != nil || g.Err() != nil {
		t.Fatalf("g took slot %d (Err %v), w holds slot %d (Err %v); b freed slot %d", g.Slot(), g.Err(), w.Slot(), w.Err(), freed)
	}
}

// An uncontended Acquire and Release: a participant's first costs the
// record's GET, the two SETs that take a slot (FenceKey) and the VDEL that
// frees it. One that held within a TTL reads the gate (nobody waits there)
// and does not go through it; it watches the record instead of reading it:
// the first time, the watch's KEYNOTIFY and GET stand for the record's
// GET, and after that the record costs nothing. The slot's holding
// watches its key besides (a KEYNOTIFY and the watch's GET, then its
// STOP), in the background: each round waits for that watch, so that each
// counts it once.
func TestSemaphoreUncontendedRequests(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	// The record exists (its first participant wrote it: a GET, a SET NX
	// and a GET more, once).
	if _, err := dial(t, srv.Addr()).Set(ctx, "s", lock.SemaphoreRecord(3), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	s := newSemaphore(t, c, lock.SemaphoreConfig{Name: "s", Limit: 3})
	round := func() int64 {
		t.Helper()
		before := srv.Requests(c.ID())
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		// The holding watches its slot (in the background) before it
		// ends, so that each round counts that watch's requests, the
		// STOP included, once.
		slot := s.Slot()
		waitFor(t, "the holding to watch its slot", func() bool { return srv.Watching(c.ID(), lock.SemaphoreSlot("s", slot)) })
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the slot's watch to end", func() bool { return !srv.Watching(c.ID(), lock.SemaphoreSlot("s", slot)) })
		return srv.Requests(c.ID()) - before
	}
	first := round()
	if srv.Watching(c.ID(), "s") {
		t.Error("a participant watches the record after its first acquisition")
	}
	second := round()
	if !srv.Watching(c.ID(), "s") {
		t.Error("a participant that acquired again within a TTL does not watch the record")
	}
	var again []int64
	for range 5 {
		again = append(again, round())
	}
	t.Logf("requests per Acquire and Release: %d the first time, %d the second, then %v", first, second, again)
	if first > 4+3 {
		t.Errorf("the first Acquire and Release sent %d requests; want 4, and 3 for the holding's watch", first)
	}
	if second > 6+3 {
		t.Errorf("the second Acquire and Release sent %d requests; want 6 (the gate's GET, the record's KEYNOTIFY and GET), and 3 for the holding's watch", second)
	}
	for _, n := range again {
		if n > 4+3 {
			t.Errorf("an Acquire and Release with the record watched sent %d requests; want 4 (the gate's GET, no read of the record), and 3 for the holding's watch", n)
		}
	}
	if srv.Watching(c.ID(), "s\x00gate") {
		t.Error("an uncontended participant watches the gate")
	}
}

// A participant holding the gate whose connection came after an outage may
// take no missing slot until its hold-off ends (a TTL): it leaves the gate
// to the waiter behind it, which takes the slot freed meanwhile, and queues
// again once its hold-off is over.
func TestSemaphoreHeldOffGateHolderLeavesTheGate(t *testing.T) {
	srv := startStore(t)
	proxy := startProxy(t, srv.Addr())
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 1, TTL: 3 * time.Second}
	a := newSemaphore(t, dial(t, srv.Addr()), cfg)
	if err := a.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	acquire := func(s *lock.Semaphore) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- s.Acquire(ctx) }()
		return ch
	}
	gc := dial(t, proxy.Addr())
	g := newSemaphore(t, gc, cfg)
	gotG := acquire(g)
	waitFor(t, "g to hold the gate and watch the slot", func() bool { return srv.Watching(gc.ID(), lock.SemaphoreSlot("s", 0)) })
	wc := dial(t, srv.Addr())
	w := newSemaphore(t, wc, cfg)
	gotW := acquire(w)
	waitFor(t, "w to wait for the gate", func() bool { return srv.Watching(wc.ID(), "s\x00gate") })

	before, err := gc.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	waitFor(t, "g to reconnect", func() bool {
		cn, err := gc.Connection(ctx)
		return err == nil && cn != before
	})
	released := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-gotW:
		if err != nil {
			t.Fatalf("w: Acquire: %v", err)
		}
	case err := <-gotG:
		t.Fatalf("g acquired (%v) within its hold-off after a reconnect", err)
	case <-time.After(waitTimeout):
		t.Fatal("w did not acquire the slot freed while g, holding the gate, was held off")
	}
	t.Logf("w took the slot %v after its release (g's hold-off: a TTL, %v)", time.Since(released).Round(time.Millisecond), cfg.TTL)
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-gotG:
		if err != nil {
			t.Fatalf("g: Acquire: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("g did not acquire once its hold-off had ended")
	}
	if took := time.Since(released); took < cfg.TTL/2 {
		t.Errorf("g took the slot %v after a's release, within its hold-off", took)
	}
}
