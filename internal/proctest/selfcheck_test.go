//go:build unix

package proctest

import (
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// TestBrokenCandidateFails checks the checks: candidates whose work ignores
// the end of its term and writes without its token must fail checks (1) and
// (2) once store restarts have made a second leader.
func TestBrokenCandidateFails(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10 s")
	}
	// Seed 3 leaves more than a TTL between restarts: candidates hold off a
	// TTL after each, so denser restarts never let a second leader in.
	cfg := config{seed: 3, faultTime: 10 * time.Second, ttl: time.Second, restarts: true, broken: true}
	res := execute(t, cfg, nil)
	rep := res.check()
	rep.log(t, res)
	if rep.restarts == 0 {
		t.Fatalf("seed %d: no store restart", cfg.seed)
	}
	if rep.unexcused == 0 {
		t.Errorf("check 1 found no unexcused overlap of broken candidates")
	}
	if len(rep.inc.violations) == 0 {
		t.Errorf("check 2 found no lost increment of broken candidates")
	}
	if t.Failed() {
		res.logFailure(t)
	}
}

// ms is n milliseconds of the wall clock in ns, for records made up by hand.
func ms(n int64) int64 { return n * int64(time.Millisecond) }

// TestOverlaps: overlaps of works are found, excused only by a pause of one
// of the two during the overlap, and a killed candidate's work ends at its
// kill; the overlap no client can prevent is told apart.
func TestOverlaps(t *testing.T) {
	starts := func(at ...int64) []event { // work_start, work_end, work_start, ...
		var evs []event
		for i, t := range at {
			evs = append(evs, event{T: ms(t), Ev: []string{"work_start", "work_end"}[i%2]})
		}
		return evs
	}
	a := &candidate{proc: &proc{name: "a", exited: ms(2000)}, log: starts(0, 300, 500), killed: ms(600)}
	b := &candidate{proc: &proc{name: "b", exited: ms(2000)}, log: starts(250, 400, 550, 700),
		pauses: []span{{ms(560), ms(580)}}}
	c := &candidate{proc: &proc{name: "c", exited: ms(2000)}, log: starts(610, 900)} // after a's kill
	d := &candidate{proc: &proc{name: "d", exited: ms(1000)}, log: starts(950)}      // open until its exit

	// e leads across a store restart (killed at 3.1 s, listening again at
	// 3.2 s); f, started after it, takes the missing key: what no client can
	// know. g, started while the store was down, must have held off.
	e := &candidate{proc: &proc{name: "e", exited: ms(4000)}, log: starts(3000, 3600)}
	f := &candidate{proc: &proc{name: "f", started: ms(3250), exited: ms(4000)}, log: starts(3300, 3400)}
	g := &candidate{proc: &proc{name: "g", started: ms(3150), exited: ms(4000)}, log: starts(3450, 3500)}
	restarts := []span{{ms(3100), ms(3200)}}

	var got []string
	for _, o := range findOverlaps([]*candidate{a, b, c, d, e, f, g}, restarts, false) {
		got = append(got, o.describe(0))
	}
	want := []string{
		"a and b worked at once from +0.250s for 50ms: NOT EXCUSED",
		"a and b worked at once from +0.550s for 50ms: excused, b (the later work) was paused +0.560s to +0.580s; the overlap ended 20ms after the pause's end",
		"b and c worked at once from +0.610s for 90ms: NOT EXCUSED",
		"e and f worked at once from +3.300s for 100ms: not excused by a pause, but no client can know it: f started at +3.250s, after the store restarted (+3.100s to +3.200s), having seen nothing; e had not reconnected yet",
		"e and g worked at once from +3.450s for 50ms: NOT EXCUSED",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("overlaps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestIncrements: check (2) on increments made up by hand, in two store
// lifetimes: 0 to 1000 ms and 1200 to 3000 ms.
func TestIncrements(t *testing.T) {
	stores := []span{{0, ms(1000)}, {ms(1200), ms(3000)}}
	// inc is an increment of read: its read sent at at[0], its write at
	// at[1] and answered at at[2], with a version of the time at[3].
	inc := func(read int64, outcome string, at ...int64) event {
		return event{Ev: "inc", ReadNs: ms(at[0]), WriteNs: ms(at[1]), T: ms(at[2]),
			Read: read, Wrote: read + 1, Outcome: outcome,
			Version: hlc.Timestamp{Wall: at[3], Node: "statestore"}.String()}
	}
	for _, tc := range []struct {
		name      string
		x, y      []event
		want      string // a violation contains it; "" for none
		ambiguous int
	}{
		{name: "each lifetime starts from 0",
			x: []event{inc(0, "ok", 10, 20, 30, 25)}, y: []event{inc(0, "ok", 1300, 1310, 1320, 1315)}},
		{name: "one value twice in a lifetime",
			x: []event{inc(0, "ok", 10, 20, 30, 25)}, y: []event{inc(0, "ok", 30, 40, 50, 45)}, want: "1 written twice"},
		{name: "one value twice, once acknowledged",
			x: []event{inc(0, "unknown", 10, 20, 30, 0), inc(0, "stale", 50, 60, 70, 0)}, y: []event{inc(0, "ok", 30, 40, 50, 45)}},
		{name: "a write across a restart, its version no help, is ambiguous",
			x: []event{inc(0, "ok", 900, 990, 1250, 500)}, y: []event{inc(0, "ok", 1300, 1310, 1320, 1315)}, ambiguous: 1},
		{name: "the version tells a write across a restart",
			x: []event{inc(0, "ok", 900, 990, 1250, 1240)}, y: []event{inc(0, "ok", 1300, 1310, 1320, 1315)},
			want: "wrote 1 in store lifetime 1 (acknowledged at +1.250s) on a read of 0 in lifetime 0"},
		{name: "the counter went on from the lost store",
			x: []event{inc(41, "ok", 900, 990, 1250, 1240)}, want: "on a read of 41 in lifetime 0"},
		{name: "a smaller value over a larger one",
			x: []event{inc(2, "ok", 10, 20, 30, 25)}, y: []event{inc(1, "ok", 15, 30, 40, 35)}, want: "wrote 2 (acknowledged at +0.040s"},
		{name: "written is not read + 1",
			x: []event{{Ev: "inc", ReadNs: ms(10), WriteNs: ms(20), T: ms(30), Read: 3, Wrote: 5, Outcome: "ok",
				Version: hlc.Timestamp{Wall: 25, Node: "statestore"}.String()}}, want: "wrote 5 after reading 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := &candidate{proc: &proc{name: "x"}, log: tc.x}
			y := &candidate{proc: &proc{name: "y"}, log: tc.y}
			res := checkIncrements([]*candidate{x, y}, stores, 0)
			got := strings.Join(res.violations, "\n")
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Errorf("violations:\n%s\nwant one with %q", got, tc.want)
			}
			if res.ambiguous != tc.ambiguous {
				t.Errorf("%d ambiguous, want %d", res.ambiguous, tc.ambiguous)
			}
		})
	}
}
