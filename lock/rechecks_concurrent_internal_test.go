package lock

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// checkHeap verifies the index bookkeeping and the heap order. r.mu held.
func (r *rechecks) checkHeap(t *testing.T) {
	t.Helper()
	for i, b := range r.q {
		if int(b.index) != i {
			t.Fatalf("box at %d has index %d", i, b.index)
		}
		if i > 0 && r.q[(i-1)/2].due > b.due {
			t.Fatalf("heap order broken at %d", i)
		}
	}
}

// Many goroutines set and stop their boxes at random: the heap stays
// consistent, every box that was set last (not stopped) fires, and a box
// whose last operation was stop is not in the heap.
func TestRechecksConcurrent(t *testing.T) {
	r := &rechecks{base: time.Now()}
	const n = 200
	var wg sync.WaitGroup
	boxes := make([]*waitBox, n)
	for i := range boxes {
		boxes[i] = newWaitBox()
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := boxes[i]
			for range 300 {
				switch rand.N(3) {
				case 0:
					r.stop(b)
				default:
					r.set(b, time.Duration(rand.N(int64(5*time.Millisecond))))
				}
				b.take()
			}
			r.set(b, time.Duration(rand.N(int64(20*time.Millisecond))))
		}()
	}
	wg.Wait()
	r.mu.Lock()
	r.checkHeap(t)
	r.mu.Unlock()
	deadline := time.After(10 * time.Second)
	for i, b := range boxes {
		for {
			if _, _, f := b.take(); f&recheckTimer != 0 {
				// The last set may have been preceded by a pending fire:
				// wait until it is out of the heap too.
				r.mu.Lock()
				in := b.index >= 0
				r.mu.Unlock()
				if !in {
					break
				}
			}
			select {
			case <-b.wake:
			case <-deadline:
				t.Fatalf("box %d never fired", i)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.q) != 0 || r.armed != 0 {
		t.Fatalf("after all fired: %d queued, armed %v", len(r.q), r.armed)
	}
}

// A box set with the longest duration (recheckAfter saturates for a huge
// TTL) must not be ordered ahead of a box due soon.
func TestRechecksSaturatedDue(t *testing.T) {
	r := &rechecks{base: time.Now().Add(-time.Second)}
	huge, soon := newWaitBox(), newWaitBox()
	r.set(huge, recheckAfter(30*365*24*time.Hour))
	if d := recheckAfter(30 * 365 * 24 * time.Hour); d != math.MaxInt64 {
		t.Logf("recheckAfter did not saturate: %v", d)
	}
	r.set(soon, 10*time.Millisecond)
	defer r.stop(huge)
	select {
	case <-soon.wake:
	case <-huge.wake:
		t.Fatal("the huge recheck fired")
	case <-time.After(5 * time.Second):
		r.mu.Lock()
		hd, sd, armed := huge.due, soon.due, r.armed
		r.mu.Unlock()
		t.Fatalf("a recheck due in 10 ms did not fire within 5 s (dues: huge %v, soon %v; armed %v)", hd, sd, armed)
	}
}
