package sskv_test

import (
	"testing"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A DEL that the store executed, but whose PUBACK and answer the client
// never got, is sent again by the client's resumed session; by then
// another client has taken the key. The repeat is answered as the first
// DEL was, and the other client's key stays. (Found by an adversarial
// review: the local store executed the copy, and deleted the key.)
func TestResentDelDoesNotUndoALaterWrite(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := dial(t, srv)
	b := dial(t, srv)
	ctx := testCtx(t)
	if _, err := a.Set(ctx, "lock", []byte("A"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Hold(a.ID(), localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	n0 := srv.Requests(a.ID())
	done := make(chan error, 1)
	go func() {
		_, err := a.Del(ctx, "lock", sskv.DelOptions{})
		done <- err
	}()
	eventually(t, "A's DEL executed", func() bool { return srv.Requests(a.ID()) > n0 })
	r, err := b.Set(ctx, "lock", []byte("B"), sskv.SetOptions{Condition: sskv.IfNotExists})
	if err != nil || !r.Applied {
		t.Fatalf("B's SET NX after A's DEL = %+v, %v", r, err)
	}
	if err := srv.Drop(a.ID()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("A's DEL: %v", err)
	}
	reconnected(t, a)
	g, err := b.Get(ctx, "lock")
	if err != nil {
		t.Fatal(err)
	}
	if !g.Found || string(g.Value) != "B" {
		t.Fatalf("B's key = %+v: A's DEL, executed before B took the key, was executed again by A's resumed session", g)
	}
}
