package fenced_test

import (
	"context"
	"testing"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A data key written with a fencing token and persisted (the keys the
// docs say to persist) by a Writer with Persist stays persisted through
// its Edit: with dynamic persistence a SET without aio-persistence: true
// takes a key off disk, so an Edit that dropped the property would lose
// the key at the next broker restart.
func TestEditKeepsPersistedKey(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistDynamic, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c := dial(t, srv.Addr())
	l := acquire(t, c, lock.Config{Name: "l"})
	w := fenced.New(c, l, fenced.Persist())
	if _, err := w.Set(testCtx(t), "data", []byte("1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Edit(testCtx(t), "data", func(v []byte, _ bool) ([]byte, error) {
		return append(v, '+'), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	next, err := srv.Restart(testCtx(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	if got := get(t, c, "data"); got != "1+" {
		t.Fatalf("a persisted data key after an Edit and a restart holds %q, want %q", got, "1+")
	}
}
