package lock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A Name (with its HolderID) too long for the keys the lock watches is a
// configuration error, given by New and NewSemaphore before anything is
// sent: a watch of such a key cannot be served (sskv.ErrKeyTooLong). The
// longest Name that fits works, waiter and handover included.
func TestNameTooLongToWatch(t *testing.T) {
	srv := startStore(t)
	c, cb, observer := dial(t, srv.Addr()), dial(t, srv.Addr()), dial(t, srv.Addr())
	const holder = "h"
	// The inbox keys of its queue are the longest a Lock watches. How long
	// a key a client can watch depends on its id's length.
	fits := min(c.MaxWatchKey(), cb.MaxWatchKey(), observer.MaxWatchKey()) - len("\x00inbox\x00") - len(holder+"2")
	for _, cfg := range []lock.Config{
		{Name: strings.Repeat("n", fits+2), HolderID: holder},
		{Name: "l", HolderID: strings.Repeat("h", c.MaxWatchKey())},
		{Name: strings.Repeat("n", 40000)},
	} {
		_, err := lock.New(c, cfg)
		if !errors.Is(err, lock.ErrConfig) || !errors.Is(err, sskv.ErrKeyTooLong) {
			t.Errorf("New(Name %d bytes, HolderID %d bytes) = %.200v; want ErrConfig and sskv.ErrKeyTooLong", len(cfg.Name), len(cfg.HolderID), err)
		}
	}
	_, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: strings.Repeat("n", fits), HolderID: holder, Limit: 2})
	if !errors.Is(err, lock.ErrConfig) || !errors.Is(err, sskv.ErrKeyTooLong) {
		t.Errorf("NewSemaphore(Name %d bytes) = %.200v; want ErrConfig and sskv.ErrKeyTooLong (its slots' names are longer)", fits, err)
	}

	name := strings.Repeat("n", fits)
	a := newLock(t, c, lock.Config{Name: name, HolderID: holder + "1"})
	b := newLock(t, cb, lock.Config{Name: name, HolderID: holder + "2"})
	mustLock(t, a)
	got := make(chan error, 1)
	go func() { got <- b.Lock(testCtx(t)) }()
	// b waits: it has joined the queue, in a's inbox, and watches its own.
	waitFor(t, "b to join the queue", func() bool {
		inbox, err := observer.Get(testCtx(t), name+"\x00inbox\x00"+holder+"1")
		return err == nil && inbox.Found && srv.Watching(cb.ID(), name+"\x00inbox\x00"+holder+"2")
	})
	if err := a.Unlock(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("b.Lock on the longest name: %v", err)
	}
}
