package lock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// fairRun is what contend measured.
type fairRun struct {
	handovers     int
	maxOvertaken  int             // the most acquisitions by others during one Lock call
	neverAcquired int             // Locks that never acquired
	handover      []time.Duration // from a release to the next acquisition
	requests      int64           // sent by all the clients over the second half
	measured      int             // handovers in the second half
	overlap       bool            // two held the lock at once
}

// contend runs n Locks on n clients of srv, each holding the lock for hold
// and calling Lock again as soon as another has taken it, until there were
// handovers acquisitions after the first. An overtake of a Lock call is an
// acquisition by someone else between the call and its own acquisition.
func contend(tb testing.TB, srv *localstore.Server, n, handovers int, hold time.Duration, fenceKey bool) fairRun {
	tb.Helper()
	// Long enough for hundreds of waiters to take their turns.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const name = "fair"
	cs := make([]*sskv.Client, n)
	ls := make([]*lock.Lock, n)
	for i := range ls {
		cs[i] = dial(tb, srv.Addr())
		ls[i] = newLock(tb, cs[i], lock.Config{Name: name, TTL: 5 * time.Second, FenceKey: fenceKey})
	}
	var (
		mu       sync.Mutex
		seq      int // acquisitions so far
		changed  = make(chan struct{})
		released time.Time
		run      fairRun
		holding  atomic.Int32
		acquired = make([]bool, n)
	)
	requests := func() (sum int64) {
		for _, c := range cs {
			sum += srv.Requests(c.ID())
		}
		return sum
	}
	var before int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() {
			for {
				mu.Lock()
				arrived := seq
				mu.Unlock()
				if err := l.Lock(ctx); err != nil {
					select {
					case <-done:
					default:
						tb.Errorf("Lock %d: %v", i, err)
					}
					return
				}
				if holding.Add(1) != 1 {
					select {
					case <-done: // Close released a holding while its work ran
					default:
						run.overlap = true
					}
				}
				mu.Lock()
				seq++
				if seq == handovers/2+1 {
					before = requests() // steady state: every waiter has entered
				}
				if seq > 1 && !released.IsZero() {
					run.handover = append(run.handover, time.Since(released))
				}
				if ov := seq - arrived - 1; ov > run.maxOvertaken && seq > 1 {
					run.maxOvertaken = ov
				}
				acquired[i] = true
				mine := seq
				close(changed)
				changed = make(chan struct{})
				finished := seq > handovers
				if finished {
					run.requests = requests() - before
					run.measured = seq - 1 - handovers/2
					select {
					case <-done:
					default:
						close(done)
					}
				}
				mu.Unlock()
				time.Sleep(hold) // the guarded work
				holding.Add(-1)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := l.Unlock(ctx); err != nil {
					select {
					case <-done: // closed meanwhile
					default:
						tb.Errorf("Unlock %d: %v", i, err)
					}
					return
				}
				// Lock again once another holds it.
				for {
					mu.Lock()
					ch, now := changed, seq
					mu.Unlock()
					if now != mine {
						break
					}
					select {
					case <-ch:
					case <-done:
						return
					}
				}
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	<-done
	for _, l := range ls {
		_ = l.Close(ctx) // ends the waits still under way
	}
	wg.Wait()
	run.handovers = handovers
	for _, ok := range acquired {
		if !ok {
			run.neverAcquired++
		}
	}
	return run
}

// TestFairWaiting: waiters are served in the order they came, and a holder
// that locks again at once goes behind them. With n waiters, none is
// overtaken more than 2n times (the documented bound), and every one of
// them acquires.
func TestFairWaiting(t *testing.T) {
	for _, fenceKey := range []bool{false, true} {
		for _, n := range []int{3, 10} {
			t.Run(fmt.Sprintf("waiters=%d/FenceKey=%v", n, fenceKey), func(t *testing.T) {
				srv := startStore(t)
				run := contend(t, srv, n, 10*n, 5*time.Millisecond, fenceKey)
				t.Logf("%d handovers: at most %d overtakes, %d never acquired, %.1f requests per handover",
					run.handovers, run.maxOvertaken, run.neverAcquired, float64(run.requests)/float64(run.measured))
				if run.overlap {
					t.Errorf("two Locks held the lock at once")
				}
				if run.neverAcquired > 0 {
					t.Errorf("%d of %d Locks never acquired the lock in %d handovers", run.neverAcquired, n, run.handovers)
				}
				if run.maxOvertaken > 2*n {
					t.Errorf("a Lock call was overtaken %d times; the bound is 2n = %d", run.maxOvertaken, 2*n)
				}
			})
		}
	}
}
