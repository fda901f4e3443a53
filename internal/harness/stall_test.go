package harness_test

import (
	"sync"
	"testing"
	"time"
)

// stallMonitor records when the test process did not run: a goroutine
// ticks every stallTick and notes each tick that came more than stallMin
// late. On a machine shared with heavier jobs the whole process can stand
// still for seconds (seeds 5125 and 5126 were silent at the same moments,
// for up to 3.3 s, while another job ran at a higher priority); the
// liveness check does not count that time against the library.
type stallMonitor struct {
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	gaps [][2]time.Time // times the process did not run, oldest first
}

const (
	stallTick = 10 * time.Millisecond
	stallMin  = 100 * time.Millisecond
)

func startStallMonitor() *stallMonitor {
	m := &stallMonitor{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tk := time.NewTicker(stallTick)
		defer tk.Stop()
		last := time.Now()
		for {
			select {
			case <-m.stop:
				return
			case <-tk.C:
			}
			now := time.Now()
			if now.Sub(last) > stallTick+stallMin {
				m.mu.Lock()
				m.gaps = append(m.gaps, [2]time.Time{last.Add(stallTick), now})
				m.mu.Unlock()
			}
			last = now
		}
	}()
	return m
}

// Stop ends the monitor's goroutine.
func (m *stallMonitor) Stop() {
	close(m.stop)
	<-m.done
}

// within returns how long the process stood still between from and to, as
// far as the monitor has seen (a stall still under way is not seen yet).
// A nil monitor sees none.
func (m *stallMonitor) within(from, to time.Time) time.Duration {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var d time.Duration
	for _, g := range m.gaps {
		start, end := g[0], g[1]
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if end.After(start) {
			d += end.Sub(start)
		}
	}
	return d
}

func TestStallMonitorWithin(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m := &stallMonitor{gaps: [][2]time.Time{{at(100), at(300)}, {at(1000), at(1500)}}}
	for _, c := range []struct {
		from, to int
		want     time.Duration
	}{
		{0, 2000, 700 * time.Millisecond},
		{200, 1200, 300 * time.Millisecond},
		{400, 900, 0},
	} {
		if got := m.within(at(c.from), at(c.to)); got != c.want {
			t.Errorf("within(%d ms, %d ms) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
	if got := (*stallMonitor)(nil).within(at(0), at(2000)); got != 0 {
		t.Errorf("a nil monitor saw %v", got)
	}
	startStallMonitor().Stop() // its goroutine ends (goleak)
}
