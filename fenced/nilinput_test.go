package fenced_test

import (
	"errors"
	"testing"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A Writer with a nil client or a nil token source, and an Edit with a nil
// change function, give an error and send nothing; they used to panic.
func TestNilInputs(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	ctx := testCtx(t)
	l := acquire(t, c, lock.Config{Name: "lock"})
	var nilLock *lock.Lock
	for name, call := range map[string]func() error{
		"New(nil client, l).Set": func() error { _, err := fenced.New(nil, l).Set(ctx, "k", []byte("v"), sskv.SetOptions{}); return err },
		"New(c, nil).Set":        func() error { _, err := fenced.New(c, nil).Set(ctx, "k", []byte("v"), sskv.SetOptions{}); return err },
		"New(c, nil *Lock).Del":  func() error { _, err := fenced.New(c, nilLock).Del(ctx, "k"); return err },
		"Edit(nil change)":       func() error { _, err := fenced.New(c, l).Edit(ctx, "k", nil); return err },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := fenced.New(c, nil).VDel(ctx, "k", []byte("v")); !errors.Is(err, fenced.ErrNoToken) {
		t.Errorf("VDel with a nil source = %v; want ErrNoToken", err)
	}
	if res, err := c.Get(ctx, "k"); err != nil || res.Found {
		t.Fatalf("k = %+v, %v; want nothing written", res, err)
	}
}
