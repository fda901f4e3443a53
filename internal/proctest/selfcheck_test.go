//go:build unix

package proctest

import (
	"slices"
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
	withKey := func(key string, ev event) event { ev.Key = key; return ev }
	withToken := func(wall int64, ev event) event { ev.Token = hlc.Timestamp{Wall: wall, Node: "t"}.String(); return ev }
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
		{name: "two counters, each from 0",
			x: []event{withKey("k1", inc(0, "ok", 10, 20, 30, 25))}, y: []event{withKey("k2", inc(0, "ok", 30, 40, 50, 45))}},
		{name: "an older token's write after a newer one's",
			x: []event{withToken(5, inc(0, "ok", 10, 20, 30, 25))}, y: []event{withToken(4, inc(1, "ok", 30, 40, 50, 45))},
			want: "y wrote 2 with token 000000000000004:00000:t (acknowledged at +0.050s) after x wrote 1 with the newer token 000000000000005:00000:t"},
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

// TestWorksPerRes: a group member's works on different elections run at
// once, each paired with its own end; overlaps are found per election only,
// and a process's first work of an election counts as its first for the
// overlap no client can prevent (perRes).
func TestWorksPerRes(t *testing.T) {
	ev := func(at int64, kind, res string) event { return event{T: ms(at), Ev: kind, Res: res} }
	a := &candidate{proc: &proc{name: "a", exited: ms(5000)}, log: []event{
		ev(0, "work_start", "e1"), ev(100, "work_start", "e2"), ev(300, "work_end", "e1"), ev(3000, "work_end", "e2"),
	}}
	got := works(a)
	want := []work{{a, "e1", span{0, ms(300)}}, {a, "e2", span{ms(100), ms(3000)}}}
	if !slices.Equal(got, want) {
		t.Errorf("works: %v, want %v", got, want)
	}
	// b overlaps a on e2 only; it started after a store restart, and its
	// e2 work is its first of e2 but not its first of all.
	b := &candidate{proc: &proc{name: "b", started: ms(1250), exited: ms(5000)}, log: []event{
		ev(1300, "work_start", "e1"), ev(1400, "work_start", "e2"), ev(1500, "work_end", "e2"),
	}}
	restarts := []span{{ms(1000), ms(1200)}}
	for _, tc := range []struct {
		perRes bool
		want   string
	}{
		{false, "e2: a and b worked at once from +1.400s for 100ms: NOT EXCUSED"},
		{true, "e2: a and b worked at once from +1.400s for 100ms: not excused by a pause, but no client can know it: b started at +1.250s, after the store restarted (+1.000s to +1.200s), having seen nothing; a had not reconnected yet"},
	} {
		var got []string
		for _, o := range findOverlaps([]*candidate{a, b}, restarts, tc.perRes) {
			got = append(got, o.describe(0))
		}
		if strings.Join(got, "\n") != tc.want {
			t.Errorf("perRes %v: overlaps:\n%s\nwant:\n%s", tc.perRes, strings.Join(got, "\n"), tc.want)
		}
	}
}

// TestCrowds: more than limit works at once are found, excused only when
// enough of them were paused, or when the extra one is the first work of a
// process started after a store restart.
func TestCrowds(t *testing.T) {
	starts := func(res string, at ...int64) []event {
		var evs []event
		for i, t := range at {
			evs = append(evs, event{T: ms(t), Ev: []string{"work_start", "work_end"}[i%2], Res: res})
		}
		return evs
	}
	a := &candidate{proc: &proc{name: "a", exited: ms(9000)}, log: starts("slot 0", 0, 1000, 2400, 3400)}
	b := &candidate{proc: &proc{name: "b", exited: ms(9000)}, log: starts("slot 1", 100, 1000, 2400, 3400)}
	c := &candidate{proc: &proc{name: "c", exited: ms(9000)}, log: starts("slot 0", 500, 600, 800, 900),
		pauses: []span{{ms(850), ms(870)}}}
	// d starts after a store restart (2.5 s to 2.6 s) and takes a slot a
	// and b held from before it, having seen nothing; e, started while the
	// store was down, must have held off.
	d := &candidate{proc: &proc{name: "d", started: ms(2700), exited: ms(9000)}, log: starts("slot 1", 3100, 3200)}
	e := &candidate{proc: &proc{name: "e", started: ms(2550), exited: ms(9000)}, log: starts("slot 1", 3250, 3300)}
	restarts := []span{{ms(2500), ms(2600)}}
	var got []string
	for _, cr := range findCrowds([]*candidate{a, b, c, d, e}, restarts, 2) {
		got = append(got, cr.describe(0))
	}
	want := []string{
		"3 works at once from +0.500s for 100ms: a (slot 0, +0.000s to +1.000s), b (slot 1, +0.100s to +1.000s), c (slot 0, +0.500s to +0.600s): NOT EXCUSED",
		"3 works at once from +0.800s for 100ms: a (slot 0, +0.000s to +1.000s), b (slot 1, +0.100s to +1.000s), c (slot 0, +0.800s to +0.900s): excused by pauses",
		"3 works at once from +3.100s for 100ms: a (slot 0, +2.400s to +3.400s), b (slot 1, +2.400s to +3.400s), d (slot 1, +3.100s to +3.200s): not excused by pauses, but no client can know it (a process started just after a store restart)",
		"3 works at once from +3.250s for 50ms: a (slot 0, +2.400s to +3.400s), b (slot 1, +2.400s to +3.400s), e (slot 1, +3.250s to +3.300s): NOT EXCUSED",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("crowds:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
