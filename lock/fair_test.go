package lock_test

import (
	"context"
	"fmt"
	"github.com/dsslock/dsslock/internal/storetest"
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

// check fails tb unless run kept the documented bounds for n waiters:
// one holder at a time, every Lock acquired, none overtaken more than 3n
// (the design's 2n, with the margin the package documentation explains)
// times.
func (run fairRun) check(tb testing.TB, n int) {
	tb.Helper()
	if run.overlap {
		tb.Errorf("two Locks held the lock at once")
	}
	if run.neverAcquired > 0 {
		tb.Errorf("%d of %d Locks never acquired the lock in %d handovers", run.neverAcquired, n, run.handovers)
	}
	if run.maxOvertaken > 3*n {
		tb.Errorf("a Lock call was overtaken %d times; the bound checked is 3n = %d", run.maxOvertaken, 3*n)
	}
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
// overtaken more than 3n times (see fairRun.check), and every one of them
// acquires.
func TestFairWaiting(t *testing.T) {
	for _, fenceKey := range []bool{false, true} {
		for _, n := range []int{3, 10} {
			t.Run(fmt.Sprintf("waiters=%d/FenceKey=%v", n, fenceKey), func(t *testing.T) {
				srv := startStore(t)
				run := contend(t, srv, n, 10*n, 5*time.Millisecond, fenceKey)
				t.Logf("%d handovers: at most %d overtakes, %d never acquired, %.1f requests per handover",
					run.handovers, run.maxOvertaken, run.neverAcquired, float64(run.requests)/float64(run.measured))
				run.check(t, n)
			})
		}
	}
}

// A waiter that dies in the queue (its client goes away without a word)
// holds nobody up for good: when its turn comes, the second waiter takes
// the key after a grace, and the others join it again (the roll call).
// Every live waiter acquires, one at a time; usually within tens of
// milliseconds, and at the latest at the waiters' safeguard check (10.5 to
// 11 TTLs).
func TestQueueSurvivesDeadWaiter(t *testing.T) {
	srv := startStore(t)
	ctx := testCtx(t)
	const ttl = 500 * time.Millisecond
	observer := dial(t, srv.Addr())
	inbox := func(l *lock.Lock) *sskv.Watcher {
		w, err := observer.Watch(ctx, "q\x00inbox\x00"+l.HolderID())
		if err != nil {
			t.Fatal(err)
		}
		storetest.SkipInitial(t, w)
		return w
	}
	// The holder keeps a queue: it waited for the lock itself.
	holder := queueKeeper(t, srv, dial(t, srv.Addr()), lock.Config{Name: "q", TTL: ttl})
	const n = 5
	clients := make([]*sskv.Client, n)
	ls := make([]*lock.Lock, n)
	got := make(chan int, n)
	for i := range n {
		clients[i] = dial(t, srv.Addr())
		ls[i] = newLock(t, clients[i], lock.Config{Name: "q", TTL: ttl})
		told := inbox(ls[i])
		go func() {
			if err := ls[i].Lock(ctx); err != nil {
				if i != 0 {
					t.Errorf("waiter %d: %v", i, err)
				}
				return
			}
			got <- i
		}()
		// One at a time, so that waiter 0 is first in the queue: the
		// holder answers each join (a SET of the waiter's inbox).
		select {
		case <-told.Events():
		case <-time.After(waitTimeout):
			t.Fatalf("the holder did not answer waiter %d's join", i)
		}
		told.Stop()
	}
	// The first waiter dies: its client is gone, with no leave.
	_ = clients[0].Close()
	start := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var inside atomic.Int32
	for range n - 1 {
		select {
		case i := <-got:
			if inside.Add(1) != 1 {
				t.Fatal("two waiters held the lock at once")
			}
			inside.Add(-1)
			if err := ls[i].Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(12 * ttl):
			t.Fatalf("no waiter acquired within 12 TTLs (%v after the release)", time.Since(start))
		}
	}
	t.Logf("%d live waiters served in %v after the release", n-1, time.Since(start))
}
