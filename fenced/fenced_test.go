package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	testCtx    = storetest.Ctx
	startStore = storetest.Start
	dial       = storetest.Dial
)

func acquire(t testing.TB, c *sskv.Client, cfg lock.Config) *lock.Lock {
	t.Helper()
	l, err := lock.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	if err := l.Lock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	return l
}

func get(t testing.TB, c *sskv.Client, key string) string {
	t.Helper()
	res, err := c.Get(testCtx(t), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(res.Value)
}

// staleSource is a holder that has not noticed it lost its lock (a process
// paused between its check and its write): it hands out its old token.
type staleSource struct {
	token  hlc.Timestamp
	fenced atomic.Pointer[error]
}

func (s *staleSource) FencingToken() (hlc.Timestamp, error) { return s.token, nil }
func (s *staleSource) Fenced(_ hlc.Timestamp, err error)    { s.fenced.Store(&err) }

// The paused-holder case: A's renewals stop reaching the store (a frozen
// connection; the store is untouched). A learns it lost the lock before its
// TTL ends, B takes over once A's lease expires, and from then on A's fenced
// writes fail with ErrStale while B's land.
func TestPausedHolderIsFencedOff(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	ca, cb := dial(t, proxy.Addr()), dial(t, srv.Addr())
	cfg := lock.Config{Name: "lock", TTL: 600 * time.Millisecond}
	a := acquire(t, ca, cfg)
	wa := fenced.New(ca, a)
	if _, err := wa.Set(testCtx(t), "data", []byte("from A"), sskv.SetOptions{}); err != nil {
		t.Fatalf("A's write while holding: %v", err)
	}

	proxy.Blackhole() // A's renewals stop reaching the store
	b, err := lock.New(cb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	bDone := make(chan error, 1)
	go func() { bDone <- b.Lock(testCtx(t)) }()

	<-a.Done()
	// A gave up on its own clock while the store still held its key.
	if h, err := b.Holder(testCtx(t)); err != nil || h.ID != a.HolderID() {
		t.Fatalf("when A noticed the loss, Holder = %+v, %v; want A's key still there", h, err)
	}
	if !errors.Is(a.Err(), lock.ErrLost) || !errors.Is(a.Err(), lock.ErrRenewDeadline) {
		t.Fatalf("a.Err = %v; want ErrLost and ErrRenewDeadline", a.Err())
	}
	if err := <-bDone; err != nil {
		t.Fatalf("B.Lock: %v", err)
	}
	if !b.Token().After(a.Token()) {
		t.Fatalf("B's token %v is not after A's %v", b.Token(), a.Token())
	}
	wb := fenced.New(cb, b)
	if _, err := wb.Set(testCtx(t), "data", []byte("from B"), sskv.SetOptions{}); err != nil {
		t.Fatalf("B's write: %v", err)
	}

	// A's writes after the takeover: refused by A itself (it knows it lost
	// the lock)...
	proxy.Heal()
	if _, err := wa.Set(testCtx(t), "data", []byte("late A"), sskv.SetOptions{}); !errors.Is(err, fenced.ErrStale) || !errors.Is(err, lock.ErrLost) {
		t.Fatalf("A's write after the takeover = %v; want ErrStale and ErrLost", err)
	}
	// ...and by the store, for a holder that did not notice: a write sent
	// with A's token, as by a process paused between its check and its send.
	stale := &staleSource{token: a.Token()}
	ws := fenced.New(ca, stale)
	for _, write := range []func() error{
		func() error { _, err := ws.Set(testCtx(t), "data", []byte("late A"), sskv.SetOptions{}); return err },
		func() error { _, err := ws.Del(testCtx(t), "data"); return err },
		func() error { _, err := ws.VDel(testCtx(t), "data", []byte("from B")); return err },
	} {
		err := write()
		if !errors.Is(err, fenced.ErrStale) || !errors.Is(err, sskv.ErrFencingTokenLower) {
			t.Fatalf("stale write = %v; want ErrStale wrapping the store's refusal", err)
		}
	}
	if stale.fenced.Load() == nil {
		t.Fatal("the source was not told that its write was fenced off")
	}
	if got := get(t, cb, "data"); got != "from B" {
		t.Fatalf("data = %q; want B's write only", got)
	}
	if _, err := wb.Set(testCtx(t), "data", []byte("B again"), sskv.SetOptions{}); err != nil {
		t.Fatalf("B's second write: %v", err)
	}
}

// A refused write ends the holding of a Lock that had not noticed it lost:
// Fenced makes it lost at once.
func TestRefusedWriteEndsTheHolding(t *testing.T) {
	srv := startStore(t)
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	a := acquire(t, ca, lock.Config{Name: "lock", TTL: time.Minute})
	// Someone newer wrote the key (as a new holder would have).
	newer, err := cb.Set(testCtx(t), "other", []byte("x"), sskv.SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Set(testCtx(t), "data", []byte("newer"), sskv.SetOptions{FencingToken: newer.Version}); err != nil {
		t.Fatal(err)
	}
	_, err = fenced.New(ca, a).Set(testCtx(t), "data", []byte("old"), sskv.SetOptions{})
	if !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("write under an older token = %v; want ErrStale", err)
	}
	<-a.Done()
	if !errors.Is(a.Err(), lock.ErrFenced) || !errors.Is(a.Err(), lock.ErrLost) {
		t.Fatalf("a.Err = %v; want ErrLost and ErrFenced", a.Err())
	}
}

// Renewals do not change a holding's token: a holder's earlier fenced
// writes never make its later ones fail, over many renewals.
func TestOwnWritesNeverFenceEachOtherOff(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	// Renewals every TTL/3; long enough that a loaded machine running the
	// race detector does not miss the renew deadline.
	ttl := 240 * time.Millisecond
	l := acquire(t, c, lock.Config{Name: "lock", TTL: ttl})
	w := fenced.New(c, l)
	end := time.Now().Add(10 * ttl)
	n := 0
	for ; time.Now().Before(end); n++ {
		if _, err := w.Set(testCtx(t), "data", fmt.Appendf(nil, "%d", n), sskv.SetOptions{}); err != nil {
			t.Fatalf("write %d: %v", n, err)
		}
	}
	h, err := l.Holder(testCtx(t))
	if err != nil || !h.Version.After(l.Token()) {
		t.Fatalf("Holder = %+v, %v; want renewals past the token %v", h, err, l.Token())
	}
	if l.Err() != nil {
		t.Fatalf("lock lost: %v", l.Err())
	}
	t.Logf("%d fenced writes over %v of renewals", n, 10*ttl)
}

func TestEdit(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	l := acquire(t, c, lock.Config{Name: "lock"})
	w := fenced.New(c, l)
	incr := func(v []byte, found bool) ([]byte, error) {
		if !found {
			return []byte("1"), nil
		}
		return append(v, '1'), nil
	}
	for range 3 {
		if _, err := w.Edit(testCtx(t), "ctr", incr); err != nil {
			t.Fatal(err)
		}
	}
	if got := get(t, c, "ctr"); got != "111" {
		t.Fatalf("ctr = %q; want 111", got)
	}
	boom := errors.New("boom")
	if _, err := w.Edit(testCtx(t), "ctr", func([]byte, bool) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("Edit with a failing change = %v; want boom", err)
	}
	if got := get(t, c, "ctr"); got != "111" {
		t.Fatalf("ctr = %q after a failed Edit", got)
	}
	if err := l.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Edit(testCtx(t), "ctr", incr); !errors.Is(err, fenced.ErrStale) || !errors.Is(err, lock.ErrReleased) {
		t.Fatalf("Edit after Unlock = %v; want ErrStale and ErrReleased", err)
	}
}
