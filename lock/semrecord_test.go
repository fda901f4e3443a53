package lock_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// told returns a function that waits until client c has told its watchers
// of key an event for which match holds. Its watch joins c's watch of key,
// which an active participant on c started before: the client calls a
// key's callback watchers in the order they joined, so the participant's
// watch has been told the event too when the function returns.
func told(t *testing.T, c *sskv.Client, key string, match func(sskv.Event) bool) func() {
	t.Helper()
	evs := make(chan sskv.Event, 64)
	w, err := c.Watch(testCtx(t), key, sskv.WithCallback(func(ev sskv.Event) {
		select {
		case evs <- ev:
		default:
			t.Error("the test's watch fell behind")
		}
	}, func(error) {}), sskv.Detached())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return func() {
		t.Helper()
		timeout := time.After(waitTimeout)
		for {
			select {
			case ev := <-evs:
				if match(ev) {
					return
				}
			case <-timeout:
				t.Fatalf("the client was not told of the change of %q", key)
			}
		}
	}
}

func isRecord(n int) func(sskv.Event) bool {
	return func(ev sskv.Event) bool {
		return ev.Op == sskv.OpSet && bytes.Equal(ev.Value, lock.SemaphoreRecord(n))
	}
}

// activate has s acquire and release twice, so that it watches the
// semaphore's record (it acquired again within a TTL).
func activate(t *testing.T, s *lock.Semaphore) {
	t.Helper()
	ctx := testCtx(t)
	for range 2 {
		if err := s.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A participant that watches the record instead of reading it still
// follows it: after the record was replaced by one of another limit, one
// whose Limit is set fails with ErrLimitMismatch, one with Limit 0 takes
// the new limit, and after the record was deleted (as a store restart
// loses it), one whose Limit is set writes it again.
func TestSemaphoreWatchedRecordChanges(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	admin := dial(t, srv.Addr())
	c := dial(t, srv.Addr())
	fixed := newSemaphore(t, c, lock.SemaphoreConfig{Name: "s", Limit: 3})
	taker := newSemaphore(t, c, lock.SemaphoreConfig{Name: "s"})
	activate(t, fixed)
	activate(t, taker)
	if !srv.Watching(c.ID(), "s") {
		t.Fatal("the participants do not watch the record")
	}

	// The limit changes from 3 to 1 (the record deleted while nobody
	// holds, and written again).
	changed := told(t, c, "s", isRecord(1))
	if _, err := admin.Del(ctx, "s", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Set(ctx, "s", lock.SemaphoreRecord(1), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	changed()
	if err := fixed.Acquire(ctx); !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("Acquire with Limit 3 after the record became 1 = %v; want ErrLimitMismatch", err)
	}
	if ok, err := fixed.TryAcquire(ctx); ok || !errors.Is(err, lock.ErrLimitMismatch) {
		t.Fatalf("TryAcquire with Limit 3 after the record became 1 = %v, %v; want ErrLimitMismatch", ok, err)
	}
	if err := taker.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if taker.Limit() != 1 || taker.Slot() != 0 {
		t.Fatalf("with Limit 0 after the record became 1: Limit %d, slot %d; want 1, 0", taker.Limit(), taker.Slot())
	}
	if err := taker.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The record vanishes: the one whose Limit is set writes its own.
	gone := told(t, c, "s", func(ev sskv.Event) bool { return ev.Op == sskv.OpDelete })
	if _, err := admin.Del(ctx, "s", sskv.DelOptions{}); err != nil {
		t.Fatal(err)
	}
	gone()
	if err := fixed.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := admin.Get(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Value, lock.SemaphoreRecord(3)) {
		t.Fatalf("the record is %q after an Acquire that found it missing; want %q", res.Value, lock.SemaphoreRecord(3))
	}
}

// A slot taken under a limit the record's watch told before the record
// changed is given back: a participant with Limit 0 waits at the gate of
// a semaphore of 2 whose slots are both held; the record becomes 1; slot
// 1 is freed. The participant, told of the new record, does not keep
// slot 1 beside slot 0's holder, which would make 2 holders of a
// semaphore of 1: it releases slot 1 and waits for slot 0.
func TestSemaphoreSlotTakenUnderStaleLimitIsReleased(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2}
	var holders [2]*lock.Semaphore
	for i := range holders {
		holders[i] = newSemaphore(t, dial(t, srv.Addr()), cfg)
		if ok, err := holders[i].TryAcquire(ctx); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	byslot := map[int]*lock.Semaphore{holders[0].Slot(): holders[0], holders[1].Slot(): holders[1]}
	wc := dial(t, srv.Addr())
	w := newSemaphore(t, wc, lock.SemaphoreConfig{Name: "s"})
	// w acquires and releases once, so that its next Acquire watches the
	// record: the holders give it slot 0 for that, and take it back.
	if err := byslot[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := byslot[0].TryAcquire(ctx); !ok || err != nil || byslot[0].Slot() != 0 {
		t.Fatal(ok, err, byslot[0].Slot())
	}
	got := make(chan error, 1)
	go func() { got <- w.Acquire(ctx) }()
	waitFor(t, "w to hold the gate and watch the slots", func() bool {
		return srv.Watching(wc.ID(), lock.SemaphoreSlot("s", 0)) && srv.Watching(wc.ID(), lock.SemaphoreSlot("s", 1))
	})
	if !srv.Watching(wc.ID(), "s") {
		t.Fatal("w, acquiring again within a TTL, does not watch the record")
	}
	changed := told(t, wc, "s", isRecord(1))
	if _, err := dial(t, srv.Addr()).Set(ctx, "s", lock.SemaphoreRecord(1), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	changed()
	if err := byslot[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	// w takes slot 1 (it watches 2 slots), then gives it back.
	select {
	case err := <-got:
		t.Fatalf("w acquired (%v) beside the holder of slot 0 of a semaphore of 1", err)
	default:
	}
	waitFor(t, "w to watch slot 0 alone", func() bool {
		return srv.Watching(wc.ID(), lock.SemaphoreSlot("s", 0)) && !srv.Watching(wc.ID(), lock.SemaphoreSlot("s", 1))
	})
	res, err := wc.Get(ctx, lock.SemaphoreSlot("s", 1))
	if err != nil {
		t.Fatal(err)
	}
	if res.Found {
		t.Fatalf("slot 1 is held (%q) in a semaphore of 1", res.Value)
	}
	select {
	case err := <-got:
		t.Fatalf("w acquired (%v) while slot 0 is held", err)
	default:
	}
	if err := byslot[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if w.Slot() != 0 || w.Limit() != 1 {
		t.Fatalf("w holds slot %d, limit %d; want slot 0, limit 1", w.Slot(), w.Limit())
	}
}

// The watch of the record lasts while the participant is active: it ends
// about a TTL after its last release, and at Close.
func TestSemaphoreRecordWatchEnds(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	cfg := lock.SemaphoreConfig{Name: "s", Limit: 2, TTL: 500 * time.Millisecond}
	c := dial(t, srv.Addr())
	s := newSemaphore(t, c, cfg)
	activate(t, s)
	released := time.Now()
	if !srv.Watching(c.ID(), "s") {
		t.Fatal("an active participant does not watch the record")
	}
	waitFor(t, "the watch of the record to end", func() bool { return !srv.Watching(c.ID(), "s") })
	if idle := time.Since(released); idle < cfg.TTL/2 {
		t.Errorf("the watch of the record ended %v after the release; want about the TTL, %v", idle, cfg.TTL)
	}
	activate(t, s)
	if !srv.Watching(c.ID(), "s") {
		t.Fatal("an active participant does not watch the record")
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Close to end the watch of the record", func() bool { return !srv.Watching(c.ID(), "s") })
}
