package lock

import (
	"testing"
	"time"
)

// The client's rechecks wake each waiter once, at its latest setting; a
// stopped recheck wakes nobody.
func TestRechecksSchedule(t *testing.T) {
	r := &rechecks{base: time.Now()}
	boxes := make([]*waitBox, 4)
	for i := range boxes {
		boxes[i] = newWaitBox()
	}
	r.set(boxes[0], time.Hour)
	r.set(boxes[1], 40*time.Millisecond)
	r.set(boxes[2], 20*time.Millisecond)
	r.set(boxes[3], 10*time.Millisecond)
	r.set(boxes[0], 30*time.Millisecond) // moved earlier
	r.set(boxes[2], time.Hour)           // moved later
	r.stop(boxes[2])
	r.stop(boxes[2]) // twice is harmless

	var order []int
	for len(order) < 3 {
		select {
		case <-boxes[0].wake:
			order = append(order, 0)
		case <-boxes[1].wake:
			order = append(order, 1)
		case <-boxes[3].wake:
			order = append(order, 3)
		case <-boxes[2].wake:
			t.Fatal("a stopped recheck woke its waiter")
		case <-time.After(5 * time.Second):
			t.Fatalf("rechecks woke %v; want 0, 1 and 3", order)
		}
	}
	for _, i := range []int{0, 1, 3} {
		if _, _, fired := boxes[i].take(); fired != recheckTimer {
			t.Errorf("box %d: fired %v; want the recheck", i, fired)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.q) != 0 || r.armed != 0 {
		t.Errorf("after every recheck fired: %d queued, timer armed at %v; want none", len(r.q), r.armed)
	}
}
