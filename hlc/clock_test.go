package hlc_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// wallClock is an injectable physical clock, in milliseconds since the epoch.
type wallClock struct{ ms atomic.Int64 }

func newWallClock(ms int64) *wallClock {
	w := &wallClock{}
	w.ms.Store(ms)
	return w
}

func (w *wallClock) Now() time.Time   { return time.UnixMilli(w.ms.Load()) }
func (w *wallClock) Set(ms int64)     { w.ms.Store(ms) }
func (w *wallClock) Advance(ms int64) { w.ms.Add(ms) }

const t0 = 1696374425000 // the protocol document's example time

func newTestClock(t testing.TB, node string, w *wallClock, opts ...hlc.Option) *hlc.Clock {
	t.Helper()
	c, err := hlc.NewClock(node, append([]hlc.Option{hlc.WithWallClock(w.Now)}, opts...)...)
	if err != nil {
		t.Fatalf("NewClock(%q): %v", node, err)
	}
	return c
}

func ts(wall int64, counter uint32, node string) hlc.Timestamp {
	return hlc.Timestamp{Wall: wall, Counter: counter, Node: node}
}

func TestNewClock(t *testing.T) {
	c, err := hlc.NewClock("StateStore")
	if err != nil {
		t.Fatal(err)
	}
	if c.Node() != "StateStore" || c.MaxDrift() != hlc.DefaultMaxDrift {
		t.Errorf("Node() = %q, MaxDrift() = %v", c.Node(), c.MaxDrift())
	}
	if p := c.Peek(); !p.IsZero() {
		t.Errorf("Peek() before any tick = %v; want the zero Timestamp", p)
	}
	// The real wall clock is used by default.
	before := time.Now().UnixMilli()
	now := c.Now()
	if after := time.Now().UnixMilli(); now.Wall < before || now.Wall > after || now.Counter != 0 || now.Node != "StateStore" {
		t.Errorf("Now() = %v; want (%d..%d, 0, StateStore)", now, before, after)
	}

	for _, node := range []string{"", "a:b", "a\n"} {
		if c, err := hlc.NewClock(node); !errors.Is(err, hlc.ErrMalformed) || c != nil {
			t.Errorf("NewClock(%q) = %v, %v; want nil, ErrMalformed", node, c, err)
		}
	}
}

func TestOptions(t *testing.T) {
	for _, tt := range []struct {
		d, want time.Duration
	}{
		{0, hlc.DefaultMaxDrift},
		{-time.Second, hlc.DefaultMaxDrift},
		{5 * time.Second, 5 * time.Second},
	} {
		c, err := hlc.NewClock("n", hlc.WithMaxDrift(tt.d), hlc.WithWallClock(nil))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.MaxDrift(); got != tt.want {
			t.Errorf("WithMaxDrift(%v): MaxDrift() = %v; want %v", tt.d, got, tt.want)
		}
		if c.Now().Wall < t0 { // WithWallClock(nil) falls back to time.Now
			t.Error("WithWallClock(nil) did not select time.Now")
		}
	}
}

func TestNow(t *testing.T) {
	w := newWallClock(t0)
	c := newTestClock(t, "local", w)
	steps := []struct {
		name    string
		advance int64
		want    hlc.Timestamp
	}{
		{"first tick takes the wall clock", 0, ts(t0, 0, "local")},
		{"same millisecond bumps the counter", 0, ts(t0, 1, "local")},
		{"again", 0, ts(t0, 2, "local")},
		{"wall moved on resets the counter", 5, ts(t0+5, 0, "local")},
		{"wall stepped back keeps the last wall", -1000, ts(t0+5, 1, "local")},
		{"wall still behind", 2, ts(t0+5, 2, "local")},
		{"wall caught up exactly", 998, ts(t0+5, 3, "local")},
		{"wall passed", 1, ts(t0+6, 0, "local")},
	}
	for _, s := range steps {
		w.Advance(s.advance)
		if got := c.Now(); got != s.want {
			t.Fatalf("%s: Now() = %v; want %v", s.name, got, s.want)
		}
		if got := c.Peek(); got != s.want {
			t.Fatalf("%s: Peek() = %v; want %v", s.name, got, s.want)
		}
	}
}

func TestNowBeforeEpoch(t *testing.T) {
	// A wall clock at or before the epoch still yields increasing, valid
	// timestamps (walls never go negative).
	w := newWallClock(-10)
	c := newTestClock(t, "n", w)
	if got, want := c.Now(), ts(0, 1, "n"); got != want {
		t.Fatalf("Now() = %v; want %v", got, want)
	}
	w.Set(0)
	if got, want := c.Now(), ts(0, 2, "n"); got != want {
		t.Fatalf("Now() = %v; want %v", got, want)
	}
}

func TestNowCounterOverflow(t *testing.T) {
	w := newWallClock(t0)
	c := newTestClock(t, "n", w)
	// Push the clock to the last counter through Update from a node whose
	// clock is slightly ahead.
	if _, err := c.Update(ts(t0+10, hlc.MaxCounter-2, "remote")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []hlc.Timestamp{
		ts(t0+10, hlc.MaxCounter, "n"),
		ts(t0+11, 0, "n"), // the counter would reach 2^31: advance the wall instead
		ts(t0+11, 1, "n"),
	} {
		if got := c.Now(); got != want {
			t.Fatalf("Now() = %v; want %v", got, want)
		}
		if err := c.Peek().Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNowExhausted(t *testing.T) {
	w := newWallClock(math.MaxInt64)
	c := newTestClock(t, "n", w)
	if _, err := c.Update(ts(math.MaxInt64, hlc.MaxCounter-1, "r")); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("Now() on an exhausted clock did not panic")
		}
	}()
	c.Now()
}

func TestUpdate(t *testing.T) {
	const node = "local"
	tests := []struct {
		name   string
		phys   int64         // physical clock during Update
		local  hlc.Timestamp // clock state before Update (zero: never ticked)
		remote hlc.Timestamp
		want   hlc.Timestamp
	}{
		{
			name:   "wall ahead of both",
			phys:   t0 + 100,
			local:  ts(t0, 5, node),
			remote: ts(t0+50, 7, "r"),
			want:   ts(t0+100, 0, node),
		},
		{
			name:   "wall ahead of a fresh clock",
			phys:   t0,
			remote: ts(t0-1, 9, "r"),
			want:   ts(t0, 0, node),
		},
		{
			name:   "equal walls, remote counter larger",
			phys:   t0,
			local:  ts(t0, 3, node),
			remote: ts(t0, 8, "r"),
			want:   ts(t0, 9, node),
		},
		{
			name:   "equal walls, local counter larger",
			phys:   t0,
			local:  ts(t0, 8, node),
			remote: ts(t0, 3, "r"),
			want:   ts(t0, 9, node),
		},
		{
			name:   "equal walls, equal counters",
			phys:   t0 - 5,
			local:  ts(t0, 4, node),
			remote: ts(t0, 4, "r"),
			want:   ts(t0, 5, node),
		},
		{
			name:   "equal walls, remote is our own last value",
			phys:   t0,
			local:  ts(t0, 4, node),
			remote: ts(t0, 4, node),
			want:   ts(t0, 5, node),
		},
		{
			name:   "local ahead",
			phys:   t0,
			local:  ts(t0+20, 4, node),
			remote: ts(t0+10, 99, "r"),
			want:   ts(t0+20, 5, node),
		},
		{
			name:   "remote ahead",
			phys:   t0,
			local:  ts(t0+10, 99, node),
			remote: ts(t0+20, 4, "r"),
			want:   ts(t0+20, 5, node),
		},
		{
			name:   "remote ahead of a fresh clock",
			phys:   t0,
			remote: ts(t0+20, 0, "r"),
			want:   ts(t0+20, 1, node),
		},
		{
			name:   "the protocol document's SET example",
			phys:   t0,
			remote: ts(t0, 0, "Client1"),
			want:   ts(t0, 1, node),
		},
		{
			name:   "remote exactly at the drift limit",
			phys:   t0,
			local:  ts(t0, 0, node),
			remote: ts(t0+60_000, 0, "r"),
			want:   ts(t0+60_000, 1, node),
		},
		{
			name:   "physical clock equal to the larger wall is not ahead",
			phys:   t0 + 10,
			local:  ts(t0, 0, node),
			remote: ts(t0+10, 3, "r"),
			want:   ts(t0+10, 4, node),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWallClock(tt.phys)
			c := newTestClock(t, node, w)
			setState(t, c, w, tt.local)
			w.Set(tt.phys)

			got, err := c.Update(tt.remote)
			if err != nil || got != tt.want {
				t.Fatalf("Update(%v) = %v, %v; want %v, nil", tt.remote, got, err, tt.want)
			}
			if !got.After(tt.remote) || (!tt.local.IsZero() && !got.After(tt.local)) {
				t.Errorf("Update(%v) = %v is not after both %v and the remote", tt.remote, got, tt.local)
			}
			if p := c.Peek(); p != got {
				t.Errorf("Peek() = %v; want %v", p, got)
			}
		})
	}
}

// setState drives a fresh clock c to the state want (unless want is zero)
// through the public API, leaving the wall clock at want.Wall.
func setState(t *testing.T, c *hlc.Clock, w *wallClock, want hlc.Timestamp) {
	t.Helper()
	if want.IsZero() {
		return
	}
	w.Set(want.Wall)
	if want.Counter == 0 {
		c.Now()
	} else if _, err := c.Update(ts(want.Wall, want.Counter-1, "setup")); err != nil {
		t.Fatal(err)
	}
	if got := c.Peek(); got != want {
		t.Fatalf("setup: clock at %v; want %v", got, want)
	}
}

func TestUpdateErrorsLeaveStateUnchanged(t *testing.T) {
	tests := []struct {
		name     string
		opts     []hlc.Option
		phys     int64
		local    hlc.Timestamp
		remote   hlc.Timestamp
		wantErr  error
		wantText string
	}{
		{
			name:     "remote past the default drift",
			phys:     t0,
			local:    ts(t0, 3, "n"),
			remote:   ts(t0+60_001, 0, "r"),
			wantErr:  hlc.ErrDrift,
			wantText: "1m0.001s ahead",
		},
		{
			name:     "remote far in the future",
			phys:     t0,
			remote:   ts(math.MaxInt64, 0, "r"),
			wantErr:  hlc.ErrDrift,
			wantText: "ms ahead",
		},
		{
			name:     "remote past a custom drift",
			opts:     []hlc.Option{hlc.WithMaxDrift(time.Second)},
			phys:     t0,
			local:    ts(t0, 3, "n"),
			remote:   ts(t0+1001, 0, "r"),
			wantErr:  hlc.ErrDrift,
			wantText: "1.001s ahead, more than the 1s allowed",
		},
		{
			name: "local clock beyond the drift after the wall clock stepped back",
			// The remote is old, but the result would keep the local wall,
			// which is now more than a minute ahead of the wall clock.
			phys:    t0 - 61_000,
			local:   ts(t0, 3, "n"),
			remote:  ts(t0-70_000, 0, "r"),
			wantErr: hlc.ErrDrift,
		},
		{name: "remote with empty node", phys: t0, local: ts(t0, 3, "n"), remote: ts(t0, 0, ""), wantErr: hlc.ErrMalformed},
		{name: "remote with ':' in node", phys: t0, local: ts(t0, 3, "n"), remote: ts(t0, 0, "a:b"), wantErr: hlc.ErrMalformed},
		{name: "remote with negative wall", phys: t0, local: ts(t0, 3, "n"), remote: ts(-1, 0, "r"), wantErr: hlc.ErrMalformed},
		{name: "remote with counter 2^31", phys: t0, local: ts(t0, 3, "n"), remote: ts(t0, hlc.MaxCounter+1, "r"), wantErr: hlc.ErrMalformed},
		{name: "zero remote", phys: t0, local: ts(t0, 3, "n"), wantErr: hlc.ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWallClock(tt.phys)
			c := newTestClock(t, "n", w, tt.opts...)
			setState(t, c, w, tt.local)
			w.Set(tt.phys)

			got, err := c.Update(tt.remote)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Update(%v) = %v, %v; want error %v", tt.remote, got, err, tt.wantErr)
			}
			if tt.wantText != "" && !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not mention %q", err, tt.wantText)
			}
			if !got.IsZero() {
				t.Errorf("Update returned %v with its error; want the zero Timestamp", got)
			}
			if p := c.Peek(); p != tt.local {
				t.Errorf("Peek() after a failed Update = %v; want %v", p, tt.local)
			}
		})
	}
}

// A counter at its maximum moves the wall on by a millisecond, as Now does,
// instead of failing: whichever of the three merge cases produced it.
func TestUpdateCounterOverflowMovesWallOn(t *testing.T) {
	tests := []struct {
		name          string
		local, remote hlc.Timestamp
		want          hlc.Timestamp
	}{
		{"remote ahead with the last counter", ts(t0, 3, "n"), ts(t0+1, hlc.MaxCounter, "r"), ts(t0+2, 0, "n")},
		{"equal walls with the last counter", ts(t0, 3, "n"), ts(t0, hlc.MaxCounter, "r"), ts(t0+1, 0, "n")},
		{"local ahead with the last counter", ts(t0+1, hlc.MaxCounter, "n"), ts(t0, 0, "r"), ts(t0+2, 0, "n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWallClock(t0)
			c := newTestClock(t, "n", w)
			setState(t, c, w, tt.local)
			w.Set(t0)
			got, err := c.Update(tt.remote)
			if err != nil || got != tt.want {
				t.Fatalf("Update(%v) = %v, %v; want %v, nil", tt.remote, got, err, tt.want)
			}
		})
	}
}

// Regression: one client's __ts just inside the drift, with a counter near
// 2^31, used to make every later Update fail with ErrOverflow until the wall
// clock caught up (up to 60 s of refused writes for every client of a store).
func TestUpdateNearMaxCounterKeepsAccepting(t *testing.T) {
	w := newWallClock(t0)
	c := newTestClock(t, "store", w)
	prev, err := c.Update(ts(t0+50_000, hlc.MaxCounter-2, "attacker"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		w.Advance(1)
		got, err := c.Update(ts(t0+int64(i), 0, "honest"))
		if err != nil {
			t.Fatalf("update %d after the near-overflow timestamp: %v", i, err)
		}
		if !got.After(prev) {
			t.Fatalf("update %d = %v; not after %v", i, got, prev)
		}
		prev = got
	}
	if prev.Wall != t0+50_001 {
		t.Errorf("clock at %v; want it one millisecond past the attacker's wall", prev)
	}
}

func TestUpdateWallExhausted(t *testing.T) {
	w := newWallClock(math.MaxInt64)
	c := newTestClock(t, "n", w)
	if _, err := c.Update(ts(math.MaxInt64, hlc.MaxCounter-1, "r")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Update(ts(math.MaxInt64, hlc.MaxCounter, "r")); !errors.Is(err, hlc.ErrOverflow) {
		t.Fatalf("Update at the end of time = %v; want ErrOverflow", err)
	}
}

func TestUpdateAfterDriftRejectionRecovers(t *testing.T) {
	w := newWallClock(t0)
	c := newTestClock(t, "n", w)
	first := c.Now()
	future := ts(t0+90_000, 0, "r")
	if _, err := c.Update(future); !errors.Is(err, hlc.ErrDrift) {
		t.Fatalf("Update(%v) error = %v; want ErrDrift", future, err)
	}
	if got, want := c.Now(), ts(t0, 1, "n"); got != want || !got.After(first) {
		t.Fatalf("Now() after rejection = %v; want %v", got, want)
	}
	// Once the wall clock is within the drift, the same timestamp is accepted.
	w.Advance(30_000)
	got, err := c.Update(future)
	if want := ts(t0+90_000, 1, "n"); err != nil || got != want {
		t.Fatalf("Update(%v) = %v, %v; want %v, nil", future, got, err, want)
	}
}

func TestCheckDrift(t *testing.T) {
	w := newWallClock(t0)
	c := newTestClock(t, "n", w, hlc.WithMaxDrift(10*time.Second))
	tests := []struct {
		wall int64
		ok   bool
	}{
		{0, true},
		{t0 - 1_000_000, true},
		{t0, true},
		{t0 + 10_000, true},
		{t0 + 10_001, false},
		{math.MaxInt64, false},
	}
	for _, tt := range tests {
		err := c.CheckDrift(ts(tt.wall, 0, "x"))
		if tt.ok && err != nil {
			t.Errorf("CheckDrift(wall %d) = %v; want nil", tt.wall, err)
		}
		if !tt.ok && !errors.Is(err, hlc.ErrDrift) {
			t.Errorf("CheckDrift(wall %d) = %v; want ErrDrift", tt.wall, err)
		}
	}
	if p := c.Peek(); !p.IsZero() {
		t.Errorf("CheckDrift changed the clock to %v", p)
	}
	// A wall clock before the epoch must not overflow the computation.
	w.Set(math.MinInt64 / 2)
	if err := c.CheckDrift(ts(math.MaxInt64, 0, "x")); !errors.Is(err, hlc.ErrDrift) {
		t.Errorf("CheckDrift with a very early wall clock = %v; want ErrDrift", err)
	}
}

// TestConcurrent hammers one clock from many goroutines, with the wall clock
// moving forwards, stalling and stepping backwards. Under -race it checks the
// locking; it also checks that all results are distinct, increase in the
// order each goroutine saw them, and exceed every remote they merged.
func TestConcurrent(t *testing.T) {
	const (
		goroutines = 8
		perG       = 2000
	)
	w := newWallClock(t0)
	c := newTestClock(t, "n", w)
	results := make([][]hlc.Timestamp, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			out := make([]hlc.Timestamp, 0, perG)
			for i := range perG {
				switch i % 7 {
				case 0:
					w.Advance(2)
				case 3:
					w.Advance(-1)
				}
				var got hlc.Timestamp
				if i%2 == 0 {
					got = c.Now()
				} else {
					remote := ts(w.Now().UnixMilli()+int64(i%5)-2, uint32(i%3), "r")
					var err error
					if got, err = c.Update(remote); err != nil {
						t.Errorf("Update(%v): %v", remote, err)
						return
					}
					if !got.After(remote) {
						t.Errorf("Update(%v) = %v, not after the remote", remote, got)
					}
				}
				if n := len(out); n > 0 && !got.After(out[n-1]) {
					t.Errorf("goroutine %d: %v after %v", g, got, out[n-1])
				}
				out = append(out, got)
			}
			results[g] = out
		})
	}
	wg.Wait()

	all := slices.Concat(results...)
	slices.SortFunc(all, hlc.Timestamp.Compare)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("value %v issued twice", all[i])
		}
	}
	if len(all) != goroutines*perG {
		t.Fatalf("got %d values; want %d", len(all), goroutines*perG)
	}
	if last := c.Peek(); last != all[len(all)-1] {
		t.Errorf("Peek() = %v; want the largest value issued, %v", last, all[len(all)-1])
	}
}

// TestWithFloor: a clock restarted with the bound of what it issued before
// issues only greater values, even with a physical clock that stepped back,
// and follows the physical clock again once it passes the floor.
func TestWithFloor(t *testing.T) {
	phys := time.UnixMilli(1_000)
	c, err := hlc.NewClock("n", hlc.WithFloor(5_000), hlc.WithWallClock(func() time.Time { return phys }))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Now(); got.Wall != 5_001 || got.Counter != 0 {
		t.Fatalf("first Now after a floor of 5000 at physical 1000: %v, want wall 5001", got)
	}
	if got := c.Now(); got.Wall != 5_001 || got.Counter != 1 {
		t.Fatalf("second Now: %v, want 5001:1", got)
	}
	phys = time.UnixMilli(9_000)
	if got := c.Now(); got.Wall != 9_000 || got.Counter != 0 {
		t.Fatalf("Now once the physical clock passed the floor: %v, want 9000:0", got)
	}
	c2, _ := hlc.NewClock("n", hlc.WithFloor(0))
	if !c2.Peek().IsZero() {
		t.Fatalf("a floor of 0 set the clock: %v", c2.Peek())
	}
}
