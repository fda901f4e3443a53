package lock_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// notALockBound is how soon a lock must report a key that will never be
// released: at once (a round trip or a few), where the caller's context
// would let it wait for WaitTimeout.
const notALockBound = 2 * time.Second

// wantNotALock checks that call, given a context that lasts far longer
// than notALockBound, fails within it with an error wrapping ErrNotALock
// whose message has each of want.
func wantNotALock(t *testing.T, what string, call func(ctx context.Context) error, want ...string) {
	t.Helper()
	ctx := testCtx(t) // WaitTimeout: ten times the bound
	start := time.Now()
	err := call(ctx)
	took := time.Since(start)
	if !errors.Is(err, lock.ErrNotALock) {
		t.Fatalf("%s: %v after %v; want an error wrapping ErrNotALock", what, err, took)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
	if took > notALockBound {
		t.Errorf("%s: took %v; want within %v", what, took, notALockBound)
	}
	t.Logf("%s: %v after %v", what, err, took)
}

// notALockCalls are the ways a lock of cfg's kind waits for, or tries, a
// key: Lock (queued and racing), TryLock, and Acquire (racing).
func notALockCalls(t *testing.T, c *sskv.Client, cfg lock.Config) map[string]func(context.Context) error {
	race := cfg
	race.Race = true
	return map[string]func(context.Context) error{
		"Lock": func(ctx context.Context) error {
			return newLock(t, c, cfg).Lock(ctx)
		},
		"Lock with Race": func(ctx context.Context) error {
			return newLock(t, c, race).Lock(ctx)
		},
		"TryLock": func(ctx context.Context) error {
			ok, err := newLock(t, c, cfg).TryLock(ctx)
			if ok {
				t.Error("TryLock took the key")
			}
			return err
		},
		"Acquire": func(ctx context.Context) error {
			_, err := acquire(ctx, t, c, race)
			return err
		},
	}
}

// A semaphore's record never expires: a Lock, with FenceKey or without,
// on a semaphore's name fails at once, saying so, where it used to wait
// forever.
func TestNotALockSemaphoreRecord(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	s, err := lock.NewSemaphore(dial(t, srv.Addr()), lock.SemaphoreConfig{Name: "jobs", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	for _, fence := range []bool{false, true} {
		for what, call := range notALockCalls(t, c, lock.Config{Name: "jobs", FenceKey: fence}) {
			if fence {
				what += " with FenceKey"
			}
			wantNotALock(t, what, call, `"dsslock-semaphore limit=2"`, "semaphore's record", "never expires")
		}
	}
}

// An election's record (a FenceKey lock's) will never be released to a
// Lock without FenceKey: its holders hand it on among themselves, and its
// key is fenced. Before, such a Lock waited while the key was fenced and
// took it when a leader resigned.
func TestNotALockElectionUnderPlainLock(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	elected, err := acquire(ctx, t, dial(t, srv.Addr()), lock.Config{Name: "e", HolderID: "leader-1", FenceKey: true, Race: true, Value: []byte("10.0.0.1:80")})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, srv.Addr())
	for what, call := range notALockCalls(t, c, lock.Config{Name: "e"}) {
		wantNotALock(t, what, call, `"leader-1\n`, "FenceKey", "election")
	}
	if elected.Err() != nil {
		t.Errorf("the election's holder lost its key: %v", elected.Err())
	}
}

// A value that no lock writes (here without expiry) is an error for every
// kind of lock.
func TestNotALockValueNoLockWrites(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	for _, v := range []string{"two\nlines", ""} {
		if _, err := c.Set(ctx, "k", []byte(v), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, fence := range []bool{false, true} {
			for what, call := range notALockCalls(t, c, lock.Config{Name: "k", FenceKey: fence}) {
				if fence {
					what += " with FenceKey"
				}
				wantNotALock(t, what, call, "no lock writes")
			}
		}
	}
}

// The record of the Azure IoT Operations SDK's leased lock (its holder's
// name, with an expiry) on a FenceKey lock's key is an error: the SDK's
// holders cannot share a key with FenceKey locks (an SDK Lock against a
// fenced key is refused, and a FenceKey handover never wakes SDK waiters).
func TestNotALockSDKRecordUnderFenceKey(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	c := dial(t, srv.Addr())
	// What the SDK's leasedlock writes: SET NEX PX of the holder's name.
	if _, err := c.Set(ctx, "k", []byte("sdk-replica-1"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for what, call := range notALockCalls(t, c, lock.Config{Name: "k", FenceKey: true}) {
		wantNotALock(t, what+" with FenceKey", call, `"sdk-replica-1"`, "another client's lock", "SDK's leased lock", "cannot share a key")
	}
}

// A Lock without FenceKey shares a key with the SDK's leased lock: its
// record, a holder's name with an expiry, is waited for (TryLock reports
// false), and taken once released.
func TestPlainLockWaitsForSDKRecord(t *testing.T) {
	for _, race := range []bool{false, true} {
		name := "queued"
		if race {
			name = "Race"
		}
		t.Run(name, func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			sdk := dial(t, srv.Addr())
			if _, err := sdk.Set(ctx, "k", []byte("sdk-replica-1"), sskv.SetOptions{Condition: sskv.IfEqualOrNotExists, Expiry: time.Minute}); err != nil {
				t.Fatal(err)
			}
			c := dial(t, srv.Addr())
			l := newLock(t, c, lock.Config{Name: "k", Race: race})
			if ok, err := l.TryLock(ctx); ok || err != nil {
				t.Fatalf("TryLock of the SDK's key = %v, %v; want false, nil", ok, err)
			}
			got := make(chan error, 1)
			go func() { got <- l.Lock(ctx) }()
			waitFor(t, "the Lock to wait on the key", func() bool { return srv.Watching(c.ID(), "k") })
			select {
			case err := <-got:
				t.Fatalf("Lock returned %v while the SDK's holder held the key", err)
			default:
			}
			// The SDK's release: VDEL of its holder's name.
			if _, err := sdk.VDel(ctx, "k", []byte("sdk-replica-1"), sskv.DelOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("Lock after the SDK's release: %v", err)
			}
		})
	}
}

// A racing waiter that sees the key take a value that will never be
// released (a notification) fails then, rather than wait on.
func TestNotALockSeenWhileWaiting(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	holder := newLock(t, dial(t, srv.Addr()), lock.Config{Name: "k"})
	mustLock(t, holder)
	c := dial(t, srv.Addr())
	got := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, t, c, lock.Config{Name: "k", Race: true})
		got <- err
	}()
	waitFor(t, "the waiter to watch the key", func() bool { return srv.Watching(c.ID(), "k") })
	other := dial(t, srv.Addr())
	wantNotALock(t, "Acquire", func(ctx context.Context) error {
		if _, err := other.Set(ctx, "k", lock.SemaphoreRecord(3), sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
		return <-got
	}, "semaphore's record")
}

// A Lock without FenceKey cannot tell a value set by hand without expiry
// from another client's holder's name, so it waits; but once the key has
// stayed unchanged across a safeguard recheck (10 TTLs), it says so in a
// warning, rather than wait in silence.
func TestUnchangedKeyWarned(t *testing.T) {
	for _, race := range []bool{false, true} {
		t.Run(map[bool]string{false: "queued", true: "Race"}[race], func(t *testing.T) {
			srv := startStore(t)
			ctx := testCtx(t)
			c := dial(t, srv.Addr())
			if _, err := c.Set(ctx, "k", []byte("hello"), sskv.SetOptions{}); err != nil {
				t.Fatal(err)
			}
			out := storetest.NewOutput()
			log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn}))
			l := newLock(t, c, lock.Config{Name: "k", TTL: 100 * time.Millisecond, Race: race, Logger: log})
			wctx, cancel := context.WithCancel(ctx)
			got := make(chan error, 1)
			go func() { got <- l.Lock(wctx) }()
			out.WaitFor(t, regexp.MustCompile(`level=WARN msg="lock: the key has not changed.*key=k value="\\"hello\\""`))
			cancel()
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Fatalf("Lock = %v, want it still waiting until cancelled", err)
			}
		})
	}
}
