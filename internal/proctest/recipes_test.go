//go:build unix

package proctest

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	recipeFaults   = 20 * time.Second // the fault phase of the short semaphore and group runs
	semProcs       = 5                // participants of the semaphore run
	semLimit       = 2                // its limit
	semSeed        = 1                // the short semaphore run's seed
	turnLimit      = 10 * time.Second // after healing, every participant holds the semaphore this soon
	groupProcs     = 3                // members of the group run
	groupElections = 6                // the group's elections
	groupSeed      = 1                // the short group run's seed
	settleLimit    = 15 * time.Second // after healing, the group's shares are even this soon
	stableFor      = 2 * time.Second  // and stay even this long, every election led
)

// recipeConfig is the configuration of a semaphore or group run: the same
// faults as TestProcesses, recipeFaults of them with seed, or as long as
// the environment variable env says with a seed from the clock.
// DSSLOCK_SEED and DSSLOCK_PROCTEST_RESTARTS apply as to TestProcesses. It
// reports whether the run is the short one.
func recipeConfig(t *testing.T, env string, seed uint64) (config, bool) {
	t.Helper()
	cfg := config{seed: seed, faultTime: recipeFaults, ttl: time.Second,
		restarts: true, storePauses: true, candidateFaults: true}
	long := os.Getenv(env)
	if long != "" {
		d, err := time.ParseDuration(long)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive duration such as 10m", env, long)
		}
		cfg.faultTime, cfg.seed = d, uint64(time.Now().UnixNano())
	}
	if s := os.Getenv("DSSLOCK_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DSSLOCK_SEED=%q: %v", s, err)
		}
		cfg.seed = seed
	}
	if s := os.Getenv("DSSLOCK_PROCTEST_RESTARTS"); s != "" {
		on, err := strconv.ParseBool(s)
		if err != nil {
			t.Fatalf("DSSLOCK_PROCTEST_RESTARTS=%q: %v", s, err)
		}
		cfg.restarts = on
	}
	if d, ok := t.Deadline(); ok && time.Until(d) < cfg.faultTime+time.Minute {
		t.Fatalf("the run takes %v and a minute more; give go test -timeout %v or more", cfg.faultTime, (cfg.faultTime + 2*time.Minute).Round(time.Minute))
	}
	return cfg, long == ""
}

// checkCommon fails t on what every run must pass: checks (1) to (3), and
// the store restarts of a short run.
func checkCommon(t *testing.T, cfg config, rep report, short bool) {
	t.Helper()
	if short && cfg.restarts && rep.restarts < minRestarts {
		t.Errorf("%d store restarts, want at least %d: choose another seed", rep.restarts, minRestarts)
	}
	if rep.unexcused > 0 {
		t.Errorf("check 1: %d overlaps of two works on one election or slot that no pause excuses, the longest %v", rep.unexcused, rep.maxUnexcused)
	}
	if n := len(rep.inc.violations); n > 0 {
		t.Errorf("check 2: %d violations", n)
	}
	if !rep.live(cfg) {
		t.Errorf("check 3: no increment acknowledged within %v of healing (TTL + %v)", cfg.ttl+livenessSlack, livenessSlack)
	}
}

// TestProcessesSemaphore runs the store and five participants of a
// lock.Semaphore of limit 2 as processes, with the faults of TestProcesses.
// Each participant loops: Acquire, a holding of 100-300 ms in which it
// increments its slot's counter with fenced read-modify-writes, Release.
// The checks: (1) no two works on one slot overlap, and never more than 2
// works run at once, unless a pause (or a process started just after a
// store restart, as in TestProcesses) excuses it; (2) no acknowledged
// increment of a slot's counter is lost, and the store accepted no write
// of a slot's holding after one of a newer holding of that slot; (3) once
// healed, an increment is acknowledged within TTL + 2 s, and every
// participant holds a slot within turnLimit; and no Acquire fails (it
// retries timeouts and lost connections, as Lock.Lock does).
//
//	DSSLOCK_PROCTEST_SEMAPHORE=10m go test -run TestProcessesSemaphore -v -timeout 15m ./internal/proctest
func TestProcessesSemaphore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 30 s")
	}
	cfg, short := recipeConfig(t, "DSSLOCK_PROCTEST_SEMAPHORE", semSeed)
	cfg.mode, cfg.procs, cfg.limit = "semaphore", semProcs, semLimit

	// After healing, wait for every participant's turn (check 4).
	var turned bool
	res := execute(t, cfg, func(r *run, healed int64) {
		turned = r.waitFor(t.Context(), time.Unix(0, healed).Add(turnLimit), func() bool {
			for _, c := range r.slots {
				if !slices.ContainsFunc(c.log, func(ev event) bool { return ev.Ev == "work_start" && ev.T > healed }) {
					return false
				}
			}
			return true
		})
	})
	rep := res.check()
	rep.log(t, res)
	c := clock(res.start)

	var all []work
	holdings := make(map[string]int) // per slot
	var turns, acquireErrors []string
	for _, cand := range res.cands {
		for _, ev := range cand.log {
			if ev.Ev == "acquire_error" {
				acquireErrors = append(acquireErrors, fmt.Sprintf("%s at %s: %s", cand.name, c.at(ev.T), ev.Err))
			}
		}
		ws := works(cand)
		all = append(all, ws...)
		for _, w := range ws {
			holdings[w.res]++
		}
		if cand.killed == 0 || cand.killed > res.healed { // alive at healing
			turn := "none"
			if i := slices.IndexFunc(ws, func(w work) bool { return w.from > res.healed }); i >= 0 {
				turn = time.Duration(ws[i].from - res.healed).Round(time.Millisecond).String()
			}
			turns = append(turns, cand.name+" "+turn)
		}
	}
	t.Logf("holdings: %d (%s), %d during the faults; at most %d at once; the longest time with no holding during the faults: %v",
		len(all), fmtCounts(holdings), countIn(all, span{res.start, res.healed}), mostAtOnce(all),
		idleLongest(all, span{res.start, res.healed}).Round(time.Millisecond))
	t.Logf("crowds (more than %d works at once): %d, of which %d not excused", cfg.limit, len(rep.crowds), rep.unexcusedCrowds)
	t.Logf("first holding after healing (at %s), per participant: %s", c.at(res.healed), strings.Join(turns, ", "))

	checkCommon(t, cfg, rep, short)
	if rep.unexcusedCrowds > 0 {
		t.Errorf("check 1: %d times more than %d works ran at once that no pause excuses", rep.unexcusedCrowds, cfg.limit)
	}
	for _, w := range all {
		if !slices.Contains(slotNames(cfg.limit), w.res) {
			t.Errorf("check 1: %s held %q, not a slot of a semaphore of limit %d", w.cand.name, w.res, cfg.limit)
		}
	}
	if len(acquireErrors) > 0 {
		t.Errorf("check 3: %d Acquire calls failed (Acquire retries lost connections and timeouts, as Lock.Lock does):\n%s",
			len(acquireErrors), strings.Join(acquireErrors, "\n"))
	}
	if !turned {
		t.Errorf("check 3: not every participant held the semaphore within %v of healing", turnLimit)
	}
	if t.Failed() {
		res.logFailure(t)
	}
}

// TestProcessesGroup runs the store and three members of a leader.Group of
// six elections as processes, with the faults of TestProcesses. Each
// member, while it leads an election, increments that election's counter
// with fenced read-modify-writes. The checks: (1) no two works on one
// election overlap, unless a pause (or a process started just after a
// store restart, as in TestProcesses) excuses it; (2) no acknowledged
// increment of an election's counter is lost, and the store accepted no
// write of a term after one of a newer term of that election; (3) once
// healed, an increment is acknowledged within TTL + 2 s; (4) within
// settleLimit of healing, every election is led (an increment
// acknowledged) and the members' shares are within one of each other, and
// stay so for stableFor.
//
//	DSSLOCK_PROCTEST_GROUP=10m go test -run TestProcessesGroup -v -timeout 15m ./internal/proctest
func TestProcessesGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 30 s")
	}
	cfg, short := recipeConfig(t, "DSSLOCK_PROCTEST_GROUP", groupSeed)
	cfg.mode, cfg.procs, cfg.elections = "group", groupProcs, groupElections

	var (
		settled int64    // when the shares were even, and stayed so (0: never)
		shares  []string // each member's elections then
	)
	res := execute(t, cfg, func(r *run, healed int64) {
		even := func() bool { return groupEven(r.slots, cfg.elections, healed) }
		deadline := time.Unix(0, healed).Add(settleLimit)
		for time.Now().Before(deadline) {
			if !r.waitFor(t.Context(), deadline, even) {
				return
			}
			from := now()
			until := time.Unix(0, from).Add(stableFor)
			if until.After(deadline) {
				until = deadline
			}
			if !r.waitFor(t.Context(), until, func() bool { return !even() }) && time.Now().After(time.Unix(0, from).Add(stableFor)) {
				settled = from
				r.mu.Lock()
				for _, c := range r.slots {
					shares = append(shares, fmt.Sprintf("%s %v", c.name, openWorks(c)))
				}
				r.mu.Unlock()
				return
			}
		}
	})
	rep := res.check()
	rep.log(t, res)

	terms := make(map[string]int) // per election
	for _, cand := range res.cands {
		for _, w := range works(cand) {
			terms[w.res]++
		}
	}
	t.Logf("terms: %d elections, %s", len(terms), fmtCounts(terms))
	if settled != 0 {
		t.Logf("shares even %v after healing, and for %v after: %s", time.Duration(settled-res.healed).Round(time.Millisecond), stableFor, strings.Join(shares, "; "))
	}

	checkCommon(t, cfg, rep, short)
	if settled == 0 {
		r := res.run
		r.mu.Lock()
		for _, c := range r.slots {
			shares = append(shares, fmt.Sprintf("%s %v", c.name, openWorks(c)))
		}
		r.mu.Unlock()
		t.Errorf("check 4: within %v of healing, the shares were not even (every election led, within one of each other) for %v; at the end: %s",
			settleLimit, stableFor, strings.Join(shares, "; "))
	}
	if t.Failed() {
		res.logFailure(t)
	}
}

// openWorks returns the res of c's works in progress (started, not ended),
// sorted; none once c has exited. Call it with the run's mu held.
func openWorks(c *candidate) []string {
	select {
	case <-c.done:
		return nil
	default:
	}
	open := make(map[string]bool)
	for _, ev := range c.log {
		switch ev.Ev {
		case "work_start":
			open[ev.Res] = true
		case "work_end":
			delete(open, ev.Res)
		}
	}
	var res []string
	for r, ok := range open {
		if ok {
			res = append(res, r)
		}
	}
	slices.Sort(res)
	return res
}

// groupEven reports whether members lead n elections between them, each
// election with an increment acknowledged after since, and the numbers
// they lead are within one of each other. Call it with the run's mu held.
func groupEven(members []*candidate, n int, since int64) bool {
	led := make(map[string]bool)
	lo, hi := n, 0
	for _, c := range members {
		open := openWorks(c)
		lo, hi = min(lo, len(open)), max(hi, len(open))
		for _, e := range open {
			if led[e] {
				return false // two members' works on e: a handover in progress
			}
			led[e] = true
		}
	}
	if len(led) != n || hi-lo > 1 {
		return false
	}
	written := make(map[string]bool)
	for _, c := range members {
		for _, ev := range c.log {
			if ev.Ev == "inc" && ev.Outcome == "ok" && ev.T > since {
				written[ev.Res] = true
			}
		}
	}
	for e := range led {
		if !written[e] {
			return false
		}
	}
	return true
}

// slotNames returns the res of the slots of a semaphore of limit n.
func slotNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("slot %d", i)
	}
	return names
}

// fmtCounts formats counts by name, sorted by name.
func fmtCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// countIn returns how many of ws started within s.
func countIn(ws []work, s span) int {
	n := 0
	for _, w := range ws {
		if s.from <= w.from && w.from <= s.to {
			n++
		}
	}
	return n
}

// mostAtOnce returns the most works of ws that ran at one moment.
func mostAtOnce(ws []work) int {
	most := 0
	for _, w := range ws {
		n := 0
		for _, x := range ws {
			if x.from <= w.from && w.from < x.to {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// idleLongest returns the longest time within s in which none of ws ran.
func idleLongest(ws []work, s span) time.Duration {
	ws = slices.Clone(ws)
	slices.SortFunc(ws, func(a, b work) int { return cmp.Compare(a.from, b.from) })
	var longest time.Duration
	covered := s.from // every moment of s before it had a work running
	for _, w := range ws {
		if w.to <= covered {
			continue
		}
		if w.from > covered {
			longest = max(longest, time.Duration(min(w.from, s.to)-covered))
		}
		covered = max(covered, w.to)
		if covered >= s.to {
			break
		}
	}
	if covered < s.to {
		longest = max(longest, time.Duration(s.to-covered))
	}
	return longest
}
