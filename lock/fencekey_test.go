package lock_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/dsslock/dsslock/internal/storetest"
	"runtime"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

func TestFenceKeyConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, cfg := range []lock.Config{
		{Name: "l", Value: []byte("v")},
		{Name: "l", HolderID: "a\nb", FenceKey: true},
	} {
		if _, err := lock.New(c, cfg); !errors.Is(err, lock.ErrConfig) {
			t.Errorf("New(%+v) = %v; want ErrConfig", cfg, err)
		}
	}
	l := newLock(t, c, lock.Config{Name: "l"})
	mustLock(t, l)
	if err := l.SetValue(testCtx(t), []byte("x")); !errors.Is(err, lock.ErrConfig) {
		t.Errorf("SetValue without FenceKey = %v; want ErrConfig", err)
	}
}

// With FenceKey, Holder reports the holder's token and value, SetValue
// changes the value and the renewals keep it, and the key is fenced: a
// write with an older token is refused.
func TestFenceKeyRecordsTokenAndValue(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	// Long enough that a loaded machine does not starve the renewals.
	a := newLock(t, c, lock.Config{Name: "l", TTL: 600 * time.Millisecond, FenceKey: true, Value: []byte("10.0.0.1:80")})
	oc := dial(t, srv.Addr())
	other := newLock(t, oc, lock.Config{Name: "l"})
	if h := holder(t, other); h.Held() {
		t.Fatalf("Holder before = %+v", h)
	}
	mustLock(t, a)
	h := holder(t, other)
	if h.ID != a.HolderID() || h.Token != a.Token() || string(h.Value) != "10.0.0.1:80" || h.Version.Before(h.Token) {
		t.Fatalf("Holder = %+v; want ID %q, token %v, value 10.0.0.1:80", h, a.HolderID(), a.Token())
	}

	ctx := testCtx(t)
	if err := a.SetValue(ctx, []byte("10.0.0.2:80")); err != nil {
		t.Fatalf("SetValue: %v", err)
	}
	// Several TTLs of renewals later, the lock is still held with the new value.
	w, err := c.Watch(ctx, "l")
	if err != nil {
		t.Fatal(err)
	}
	storetest.SkipInitial(t, w)
	defer w.Stop()
	for renewals := 0; renewals < 6; {
		ev := <-w.Events()
		if ev.Op != sskv.OpSet {
			t.Fatalf("event %+v while the holder renews", ev)
		}
		if got := lock.ParseHolder(ev.Value, ev.Version); string(got.Value) != "10.0.0.2:80" || got.Token != a.Token() {
			t.Fatalf("renewal wrote %+v", got)
		}
		renewals++
	}
	if a.Err() != nil {
		t.Fatalf("a.Err = %v after SetValue and renewals", a.Err())
	}

	// A write fenced with a token older than a's is refused by the store.
	older := a.Token()
	older.Wall--
	if _, err := c.Set(ctx, "l", []byte("x"), sskv.SetOptions{FencingToken: older}); !errors.Is(err, sskv.ErrFencingTokenLower) {
		t.Fatalf("SET with an older token = %v; want ErrFencingTokenLower", err)
	}
	// A waiter finds the lock held, and takes it on Unlock. (It has
	// FenceKey too: a Lock without it fails with ErrNotALock on a FenceKey
	// lock's record, see TestNotALockElectionUnderPlainLock.)
	waiter := newLock(t, oc, lock.Config{Name: "l", FenceKey: true})
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	waitFor(t, "the waiter to watch", func() bool { return srv.Watching(oc.ID(), "l") })
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if err := a.SetValue(ctx, []byte("late")); !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("SetValue after Unlock = %v; want ErrReleased", err)
	}
}

// Holders with FenceKey contend as plain ones do: one at a time, tokens
// increasing, handover on Unlock.
func TestFenceKeyHandover(t *testing.T) {
	srv := startStore(t)
	cs := []*sskv.Client{dial(t, srv.Addr()), dial(t, srv.Addr())}
	ls := []*lock.Lock{
		newLock(t, cs[0], lock.Config{Name: "l", FenceKey: true}),
		newLock(t, cs[1], lock.Config{Name: "l", FenceKey: true}),
	}
	ctx := testCtx(t)
	mustLock(t, ls[0])
	last := ls[0].Token()
	for i := 1; i <= 10; i++ {
		holder, waiter, wc := ls[(i-1)%2], ls[i%2], cs[i%2]
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		waitFor(t, "the waiter to watch", func() bool { return srv.Watching(wc.ID(), "l") })
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if !waiter.Token().After(last) {
			t.Fatalf("round %d: token %v not after %v", i, waiter.Token(), last)
		}
		last = waiter.Token()
	}
}

// A holder whose connection freezes loses the lock by its deadline; its
// key then expires and a waiter takes over; the frozen holder's SetValue
// is refused, on its own clock first.
func TestFenceKeyFrozenHolder(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	a := newLock(t, dial(t, proxy.Addr()), lock.Config{Name: "l", TTL: 300 * time.Millisecond, FenceKey: true})
	b := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "l", TTL: 300 * time.Millisecond, FenceKey: true, Value: []byte("b")})
	mustLock(t, a)
	proxy.Blackhole()
	ctx := testCtx(t)
	<-a.Done()
	if !errors.Is(a.Err(), lock.ErrRenewDeadline) {
		t.Fatalf("a.Err = %v; want ErrRenewDeadline", a.Err())
	}
	mustLock(t, b)
	if err := a.SetValue(ctx, []byte("a")); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("frozen SetValue = %v; want ErrLost", err)
	}
	proxy.Heal()
	h := holder(t, b)
	if h.ID != b.HolderID() || !bytes.Equal(h.Value, []byte("b")) || h.Token != b.Token() {
		t.Fatalf("Holder = %+v; want b's", h)
	}
}

// The guard of a holding that came from a wait goes on with the waiter's
// watch (handed off to the guard): a deletion by hand, or a takeover,
// ends the holding as lost at once, with no goroutine of its own. The TTL
// is long enough that no renewal goes out before waitTimeout: only the
// guard can notice.
func TestFenceKeyGuardAfterWait(t *testing.T) {
	srv := startStore(t)
	admin := dial(t, srv.Addr())
	ctx := testCtx(t)
	for _, tc := range []struct {
		name   string
		change func(key string, token hlc.Timestamp) error
		want   error
	}{
		{"deleted", func(key string, token hlc.Timestamp) error {
			_, err := admin.Del(ctx, key, sskv.DelOptions{FencingToken: token})
			return err
		}, lock.ErrKeyLost},
		{"taken", func(key string, token hlc.Timestamp) error {
			_, err := admin.Set(ctx, key, []byte("intruder\n"), sskv.SetOptions{FencingToken: token, Expiry: time.Second})
			return err
		}, lock.ErrHeldByOther},
	} {
		for _, race := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/race=%v", tc.name, race), func(t *testing.T) {
				key := fmt.Sprintf("l-%s-%v", tc.name, race)
				cfg := lock.Config{Name: key, FenceKey: true, TTL: 3 * waitTimeout, Race: race}
				holder := newLock(t, dial(t, srv.Addr()), cfg)
				wc := dial(t, srv.Addr())
				waiter := newLock(t, wc, cfg)
				mustLock(t, holder)
				got := make(chan error, 1)
				go func() { got <- waiter.Lock(ctx) }()
				waitFor(t, "the waiter to watch", func() bool { return srv.Watching(wc.ID(), key) })
				if err := holder.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
				if !srv.Watching(wc.ID(), key) {
					t.Fatal("the holding does not watch its key")
				}
				if err := tc.change(key, waiter.Token()); err != nil {
					t.Fatal(err)
				}
				select {
				case <-waiter.Done():
				case <-time.After(waitTimeout):
					t.Fatal("the holding outlived the change of its key")
				}
				if !errors.Is(waiter.Err(), tc.want) {
					t.Fatalf("Err = %v; want %v", waiter.Err(), tc.want)
				}
				if err := waiter.Unlock(ctx); err != nil {
					t.Logf("Unlock: %v", err)
				}
				waitFor(t, "the watch to end with the holding", func() bool { return !srv.Watching(wc.ID(), key) })
			})
		}
	}
}

// Held FenceKey locks cost no goroutine each: their guards are callback
// watches.
func TestFenceKeyHoldingsCostNoGoroutine(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	const n = 50
	before := runtime.NumGoroutine()
	ls := make([]*lock.Lock, n)
	for i := range ls {
		ls[i] = newLock(t, c, lock.Config{Name: fmt.Sprintf("l%d", i), FenceKey: true})
		mustLock(t, ls[i])
	}
	for i := range ls {
		waitFor(t, "the guard to watch", func() bool { return srv.Watching(c.ID(), fmt.Sprintf("l%d", i)) })
	}
	if extra := runtime.NumGoroutine() - before; extra > n/5 {
		t.Fatalf("%d held locks added %d goroutines", n, extra)
	}
	for _, l := range ls {
		if err := l.Unlock(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
}
