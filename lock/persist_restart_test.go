package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// With every key persisted (PersistAll), store restarts (Server.Restart,
// as a crash and restart would) change no holder: the holder reconnects,
// finds its key at the same version and renews it, with the same token,
// and its holding does not end; a waiter queued behind it does not take
// the key that came back. Once the holder unlocks, the waiter gets it.
func TestPersistedRestartKeepsHolder(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := "plain"
		if fence {
			name = "FenceKey"
		}
		t.Run(name, func(t *testing.T) {
			srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = srv.Close() })
			renewed := make(chan error, 100)
			cfg := lock.Config{Name: "l", TTL: 3 * time.Second, FenceKey: fence}
			acfg := cfg
			acfg.OnRenewal = func(_ time.Duration, err error) {
				select {
				case renewed <- err:
				default:
				}
			}
			a := newLock(t, dial(t, srv.Addr()), acfg)
			mustLock(t, a)
			token := a.Token()
			b := newLock(t, dial(t, srv.Addr()), cfg)
			bGot := make(chan error, 1)
			go func() { bGot <- b.Lock(testCtx(t)) }()
			for i := range 5 {
				next, err := srv.Restart(testCtx(t), 300*time.Millisecond)
				if err != nil {
					t.Fatalf("restart %d: %v", i, err)
				}
				srv = next
				t.Cleanup(func() { _ = next.Close() })
				// Drain the renewals from before the restart, then wait
				// for two that succeed after it.
				for len(renewed) > 0 {
					<-renewed
				}
				for ok := 0; ok < 2; {
					select {
					case err := <-renewed:
						if err == nil {
							ok++
						}
					case <-a.Done():
						t.Fatalf("restart %d: the holding ended: %v", i, a.Err())
					case err := <-bGot:
						t.Fatalf("restart %d: the waiter took the lock (%v) while a held it", i, err)
					case <-time.After(waitTimeout):
						t.Fatalf("restart %d: no renewal succeeded after the restart", i)
					}
				}
				if got := a.Token(); got != token {
					t.Fatalf("restart %d: token %v, was %v", i, got, token)
				}
			}
			select {
			case <-a.Done():
				t.Fatalf("the holding ended: %v", a.Err())
			case err := <-bGot:
				t.Fatalf("the waiter took the lock (%v) while a held it", err)
			default:
			}
			if err := a.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-bGot:
				if err != nil {
					t.Fatalf("the waiter's Lock after the unlock: %v", err)
				}
			case <-time.After(waitTimeout):
				t.Fatal("the waiter did not get the lock after the unlock")
			}
		})
	}
}
