package interop

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/Azure/iot-operations-sdks/go/services/leasedlock"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
)

// A FenceKey lock, and so an election, cannot share a key with the SDK's
// leased lock: one that finds an SDK holder's record on its key fails at
// once with lock.ErrNotALock, naming the SDK, rather than wait (an SDK Lock
// against a fenced key would be refused, and a FenceKey handover would
// never wake SDK waiters). The SDK's holder keeps its lock.
func TestFenceKeyMeetsSDKLeasedLock(t *testing.T) {
	e := newEnv(t)
	sdk := e.newClient("sdk-holder")
	name := e.key("lock")
	lk := leasedlock.NewLock(sdk.ss, name)
	if err := lk.Lock(e.ctx, time.Minute); err != nil {
		t.Fatalf("SDK Lock: %v", err)
	}
	defer func() { _ = lk.Unlock(context.Background()) }()

	c := e.ourClient("fenced")
	for what, call := range map[string]func(ctx context.Context) error{
		"Lock with FenceKey": func(ctx context.Context) error {
			return e.ourLock(c, lock.Config{Name: name, FenceKey: true}).Lock(ctx)
		},
		"Campaign": func(ctx context.Context) error {
			term, err := leader.Campaign(ctx, c, name, []byte("10.0.0.1:80"))
			if term != nil {
				_ = term.Resign(context.Background())
			}
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, lock.ErrNotALock) || !strings.Contains(err.Error(), "SDK's leased lock") {
			t.Fatalf("%s on the SDK's lock: %v after %v; want lock.ErrNotALock naming the SDK", what, err, took)
		}
		if took > 2*time.Second {
			t.Errorf("%s took %v to fail; want within 2 s", what, took)
		}
		t.Logf("%s: %v after %v", what, err, took)
	}
	wantHolder(t, e.ctx, lk.Lease, sdk.id, true)
}
