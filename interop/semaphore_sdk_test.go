package interop

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"

	"github.com/dsslock/dsslock/lock"
)

// A semaphore and SDK replicas on one key (docs/migrating.md, "Never"): a
// semaphore that finds an SDK holder's name on its key fails at once, but
// an SDK replica that finds the semaphore's record waits for a key that
// never expires, until its context ends.
func TestSemaphoreAndSDKLeasedLock(t *testing.T) {
	e := newEnv(t)
	sdk := e.newClient("sdk-holder")
	c := e.ourClient("sem")

	held := e.key("held-by-sdk")
	lk := leasedlock.NewLock(sdk.ss, held)
	if err := lk.Lock(e.ctx, time.Minute); err != nil {
		t.Fatalf("SDK Lock: %v", err)
	}
	defer func() { _ = lk.Unlock(context.Background()) }()
	s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: held, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Acquire(e.ctx)
	if !errors.Is(err, lock.ErrLimitMismatch) || time.Since(start) > 2*time.Second {
		t.Fatalf("semaphore on the SDK's key: %v after %v; want lock.ErrLimitMismatch at once", err, time.Since(start))
	}

	sem := e.key("semaphore")
	s2, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: sem, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Acquire(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := s2.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Second)
	defer cancel()
	lk2 := leasedlock.NewLock(sdk.ss, sem)
	err = lk2.Lock(ctx, time.Minute)
	if err == nil {
		_ = lk2.Unlock(context.Background())
		t.Fatal("the SDK took a semaphore's name")
	}
	if ctx.Err() == nil {
		t.Fatalf("SDK Lock on a semaphore's name: %v before its context ended; the guide says it waits", err)
	}
	t.Logf("SDK Lock on a semaphore's name: waited until its context ended: %v", err)
}
