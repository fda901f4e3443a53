package fenced_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A write of an earlier holding that arrives late and is refused ends that
// holding only, not the Lock's current one: the Lock released and took the
// lock again while the write was held up in the network.
func TestLateRefusalSparesNewHolding(t *testing.T) {
	srv := startStore(t)
	proxy, err := faultproxy.Start(srv.Addr(), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	c, slow := dial(t, srv.Addr()), dial(t, proxy.Addr())
	l := acquire(t, c, lock.Config{Name: "lock", TTL: time.Minute})
	first := l.Token()
	proxy.SetDelay(500 * time.Millisecond)
	late := make(chan error, 1)
	src := &tokenTaken{TokenSource: l, taken: make(chan struct{})}
	go func() {
		_, err := fenced.New(slow, src).Set(testCtx(t), "data", []byte("old"), sskv.SetOptions{})
		late <- err
	}()
	<-src.taken // the write goes out with the first holding's token

	if err := l.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := l.Lock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if !l.Token().After(first) {
		t.Fatalf("new token %v not after %v", l.Token(), first)
	}
	if _, err := fenced.New(c, l).Set(testCtx(t), "data", []byte("new"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-late; !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("the late write of the first holding = %v; want ErrStale", err)
	}
	if l.Err() != nil {
		t.Fatalf("the refusal of the first holding's write ended the second: %v", l.Err())
	}
	if got := get(t, c, "data"); got != "new" {
		t.Fatalf("data = %q; want new", got)
	}
}

// tokenTaken is a token source that tells when its token was first taken.
type tokenTaken struct {
	fenced.TokenSource
	taken chan struct{}
	once  sync.Once
}

func (s *tokenTaken) FencingToken() (hlc.Timestamp, error) {
	defer s.once.Do(func() { close(s.taken) })
	return s.TokenSource.FencingToken()
}

// Edit writes with the token it read under. Here, between its read and its
// write, the Lock loses and takes the lock again, and another holder writes
// the key in between: the write back must not go out under the new token,
// which would overwrite the other holder's write with a value computed from
// what was read before it.
func TestEditWritesUnderItsReadToken(t *testing.T) {
	srv := startStore(t)
	ca, cb := dial(t, srv.Addr()), dial(t, srv.Addr())
	a := acquire(t, ca, lock.Config{Name: "lock", TTL: time.Minute})
	b, err := lock.New(cb, lock.Config{Name: "lock", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(testCtx(t)) })
	wa := fenced.New(ca, a)
	if _, err := wa.Set(testCtx(t), "ctr", []byte("1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = wa.Edit(testCtx(t), "ctr", func(v []byte, _ bool) ([]byte, error) {
		// a loses the lock, b takes it and writes, a takes it back.
		if err := a.Unlock(testCtx(t)); err != nil {
			return nil, err
		}
		if err := b.Lock(testCtx(t)); err != nil {
			return nil, err
		}
		if _, err := fenced.New(cb, b).Set(testCtx(t), "ctr", []byte("2"), sskv.SetOptions{}); err != nil {
			return nil, err
		}
		if err := b.Unlock(testCtx(t)); err != nil {
			return nil, err
		}
		if err := a.Lock(testCtx(t)); err != nil {
			return nil, err
		}
		return append(v, '+'), nil
	})
	if !errors.Is(err, fenced.ErrStale) {
		t.Fatalf("Edit across a change of token = %v; want ErrStale", err)
	}
	if got := get(t, ca, "ctr"); got != "2" {
		t.Fatalf("ctr = %q; want b's write, 2", got)
	}
	if a.Err() != nil {
		t.Fatalf("a.Err = %v", a.Err())
	}
}

// An Edit that read no key creates it only if it is still missing.
func TestEditCreateConflict(t *testing.T) {
	srv := startStore(t)
	c, other := dial(t, srv.Addr()), dial(t, srv.Addr())
	l := acquire(t, c, lock.Config{Name: "lock", TTL: time.Minute})
	_, err := fenced.New(c, l).Edit(testCtx(t), "k", func(v []byte, found bool) ([]byte, error) {
		if found {
			t.Errorf("found %q", v)
		}
		if _, err := other.Set(testCtx(t), "k", []byte("theirs"), sskv.SetOptions{}); err != nil {
			return nil, err
		}
		return []byte("mine"), nil
	})
	if !errors.Is(err, fenced.ErrConflict) {
		t.Fatalf("Edit = %v; want ErrConflict", err)
	}
	if got := get(t, c, "k"); got != "theirs" {
		t.Fatalf("k = %q; want theirs", got)
	}
}

// zeroSource hands out a zero token without an error.
type zeroSource struct{}

func (zeroSource) FencingToken() (hlc.Timestamp, error) { return hlc.Timestamp{}, nil }
func (zeroSource) Fenced(hlc.Timestamp, error)          {}

// A token source that gives a zero token makes every write fail: it would
// not be fenced at all.
func TestZeroTokenNotSent(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	w := fenced.New(c, zeroSource{})
	if _, err := w.Set(testCtx(t), "k", []byte("v"), sskv.SetOptions{}); !errors.Is(err, fenced.ErrNoToken) {
		t.Fatalf("Set = %v; want ErrNoToken", err)
	}
	if _, err := w.Del(testCtx(t), "k"); !errors.Is(err, fenced.ErrNoToken) {
		t.Fatalf("Del = %v; want ErrNoToken", err)
	}
	if _, err := w.Edit(testCtx(t), "k", func([]byte, bool) ([]byte, error) { return []byte("v"), nil }); !errors.Is(err, fenced.ErrNoToken) {
		t.Fatalf("Edit = %v; want ErrNoToken", err)
	}
	if res, err := c.Get(testCtx(t), "k"); err != nil || res.Found {
		t.Fatalf("k = %+v, %v; want nothing written", res, err)
	}
}

// After a store restart that lost the lock's key, a fenced write made before
// the holder has confirmed its key does not go out: the holding ends first,
// and the write fails with ErrStale, instead of creating the key in the new
// store with the old token (the restart lost the key's fence).
func TestFencedWriteAfterStoreRestart(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	l := acquire(t, c, lock.Config{Name: "lock", TTL: 6 * time.Second})
	w := fenced.New(c, l)
	if _, err := w.Set(testCtx(t), "data", []byte("before"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	srv = storetest.Restart(t, srv, 300*time.Millisecond)
	if _, err := w.Set(testCtx(t), "data", []byte("after"), sskv.SetOptions{}); !errors.Is(err, fenced.ErrStale) || !errors.Is(err, lock.ErrKeyLost) {
		t.Fatalf("fenced write after a restart = %v; want ErrStale and lock.ErrKeyLost", err)
	}
	if res, err := dial(t, srv.Addr()).Get(testCtx(t), "data"); err != nil || res.Found {
		t.Fatalf("data = %+v, %v after the restart; want it missing", res, err)
	}
}
