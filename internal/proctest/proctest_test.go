//go:build unix

package proctest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	candidates      = 3                // candidate processes at any time
	shortFaults     = 25 * time.Second // the fault phase of the short run
	shortSeed       = 1                // the short run's seed: CI draws the same faults every time
	minRestarts     = 3                // store restarts the short run must include
	livenessSlack   = 2 * time.Second  // a leader must write within TTL + this of healing
	firstWriteLimit = 15 * time.Second // a leader must write this soon after the start
	stopLimit       = 5 * time.Second  // a process that takes longer to stop on SIGTERM is killed
	shownViolations = 20               // violations of check (2) printed, of each run
)

// config is what a run does.
type config struct {
	seed            uint64
	faultTime       time.Duration // faults are injected for this long
	ttl             time.Duration // the candidates' lease
	restarts        bool          // kill -9 and restart the store
	storePauses     bool          // SIGSTOP and SIGCONT the store
	candidateFaults bool          // SIGSTOP and SIGCONT, and kill -9, candidates
	broken          bool          // candidates ignore the end of their terms and write unfenced
	persist         bool          // the store persists every key (-persist all): restarts lose nothing
	mode            string        // what the candidates hold (their -mode): "" (the election), "semaphore" or "group"
	procs           int           // candidate processes at any time; 0: candidates
	limit           int           // the semaphore's limit (mode semaphore)
	elections       int           // the group's elections (mode group)
}

// nprocs is how many candidate processes cfg runs at any time.
func (cfg config) nprocs() int {
	if cfg.procs > 0 {
		return cfg.procs
	}
	return candidates
}

// persistRestarts is how many store restarts the persisting run must include.
const persistRestarts = 20

// TestProcessesPersisted runs the store with -persist all, killed (kill -9)
// and restarted on the same port and data directory, with down times
// (0.1-0.5 s) shorter than what the candidates' leases (TTL 3 s) leave to
// renew, and no other fault: with every key persisted, a restart changes
// no leader. The leader reconnects, finds its key at the same version and
// goes on; the others, waiting, do not take a key that came back. So: one
// term over the whole run, no overlap at all, and no increment lost over
// the store's lifetimes (the counter survives them). DSSLOCK_PROCTEST_PERSIST
// sets the fault phase (default 30 s; at least 20 restarts are required).
func TestProcessesPersisted(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 40 s")
	}
	d := 30 * time.Second
	if s := os.Getenv("DSSLOCK_PROCTEST_PERSIST"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			t.Fatalf("DSSLOCK_PROCTEST_PERSIST=%q: want a positive duration", s)
		}
	} else if os.Getenv("DSSLOCK_PROCTEST_PERSIST_RUN") == "" {
		t.Skip("set DSSLOCK_PROCTEST_PERSIST_RUN=1 (or DSSLOCK_PROCTEST_PERSIST=<duration>) to run it")
	}
	cfg := config{seed: uint64(time.Now().UnixNano()), faultTime: d, ttl: 3 * time.Second, restarts: true, persist: true}
	if s := os.Getenv("DSSLOCK_PROCTEST_TTL"); s != "" { // a shorter TTL leaves less time to reconnect
		var err error
		if cfg.ttl, err = time.ParseDuration(s); err != nil || cfg.ttl <= 0 {
			t.Fatalf("DSSLOCK_PROCTEST_TTL=%q: want a positive duration", s)
		}
	}
	if s := os.Getenv("DSSLOCK_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DSSLOCK_SEED=%q: %v", s, err)
		}
		cfg.seed = seed
	}
	res := execute(t, cfg, nil)
	rep := res.check()
	rep.log(t, res)
	terms := 0
	for _, c := range res.cands {
		terms += len(works(c))
	}
	t.Logf("persisted: %d terms over %d store restarts", terms, rep.restarts)
	if rep.restarts < persistRestarts {
		t.Errorf("%d store restarts, want at least %d: run longer", rep.restarts, persistRestarts)
	}
	if terms != 1 {
		t.Errorf("%d terms: a store restart changed the leader, or ended its term, though every key persisted", terms)
	}
	if len(rep.overlaps) > 0 {
		t.Errorf("%d overlaps", len(rep.overlaps))
	}
	if n := len(rep.inc.violations); n > 0 {
		t.Errorf("check 2: %d violations", n)
	}
	if !rep.live(cfg) {
		t.Errorf("check 3: no increment acknowledged within %v of healing", cfg.ttl+livenessSlack)
	}
	if t.Failed() {
		res.logFailure(t)
	}
}

// TestProcesses runs the store and three candidates as processes, injects
// faults, and checks the record; see the package documentation.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 30 s")
	}
	cfg := config{seed: shortSeed, faultTime: shortFaults, ttl: time.Second,
		restarts: true, storePauses: true, candidateFaults: true}
	long := os.Getenv("DSSLOCK_PROCTEST")
	if long != "" {
		d, err := time.ParseDuration(long)
		if err != nil || d <= 0 {
			t.Fatalf("DSSLOCK_PROCTEST=%q: want a positive duration such as 10m", long)
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

	res := execute(t, cfg, nil)
	rep := res.check()
	rep.log(t, res)
	if long == "" && cfg.restarts && rep.restarts < minRestarts {
		t.Errorf("%d store restarts, want at least %d: choose another DSSLOCK_SEED", rep.restarts, minRestarts)
	}
	if rep.unexcused > 0 {
		t.Errorf("check 1: %d overlaps of two candidates' works that no pause excuses, the longest %v", rep.unexcused, rep.maxUnexcused)
	}
	if n := len(rep.inc.violations); n > 0 {
		t.Errorf("check 2: %d violations", n)
	}
	if !rep.live(cfg) {
		t.Errorf("check 3: no increment acknowledged within %v of healing (TTL + %v)", cfg.ttl+livenessSlack, livenessSlack)
	}
	if t.Failed() {
		res.logFailure(t)
	}
}

// result is a finished run.
type result struct {
	*run
	logs   string // the directory of the logs
	start  int64  // when the fault phase began
	healed int64  // when every fault was healed
	stop   int64  // when the processes were told to stop
}

// execute runs the programs with faults drawn from cfg.seed, heals them,
// waits for a leader's write and then, if settle is not nil, calls it (with
// the run and the time of healing) before it stops every process; it stops
// them all before it returns. An error of the test itself (a build, a
// process that would not start or exited unexpectedly) ends the test.
func execute(t *testing.T, cfg config, settle func(r *run, healed int64)) *result {
	t.Logf("seed %d, %v of faults; replay with DSSLOCK_SEED=%d", cfg.seed, cfg.faultTime, cfg.seed)
	logs, err := os.MkdirTemp("", "proctest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			_ = os.RemoveAll(logs)
		}
	})
	ctx := t.Context()
	storeBin, candidateBin, err := buildPrograms(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 0))
	timelines := plan(cfg, rng)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &run{cfg: cfg, dir: logs, storeBin: storeBin, candidateBin: candidateBin,
		addr: fmt.Sprintf("127.0.0.1:%d", port), okCh: make(chan struct{}, 1), evCh: make(chan struct{}, 1),
		slots: make([]*candidate, cfg.nprocs())}
	t.Cleanup(r.killAll)
	fatal := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d: %s; logs in %s", cfg.seed, fmt.Sprintf(format, args...), logs)
	}

	if _, err := r.startStore(ctx); err != nil {
		fatal("%v", err)
	}
	for slot := range cfg.nprocs() {
		if err := r.startCandidate(slot); err != nil {
			fatal("%v", err)
		}
	}
	if !r.waitWrite(ctx, 0, time.Now().Add(firstWriteLimit)) {
		fatal("no increment acknowledged within %v of the start", firstWriteLimit)
	}

	phase, cancel := context.WithTimeout(ctx, cfg.faultTime)
	res := &result{run: r, logs: logs, start: now()}
	err = r.inject(phase, time.Unix(0, res.start), timelines)
	cancel()
	if err != nil {
		fatal("%v", err)
	}
	res.healed = now()
	r.waitWrite(ctx, res.healed, time.Unix(0, res.healed).Add(cfg.ttl+livenessSlack)) // check (3) reads the logs
	if settle != nil {
		settle(r, res.healed)
	}
	res.stop = now()
	r.stopAll(stopLimit)

	for _, c := range r.cands {
		if err := c.exitErr(); c.killed == 0 && err != nil {
			r.errs = append(r.errs, fmt.Sprintf("%s exited: %v; see %s", c.name, err, filepath.Join(logs, c.name+".log")))
		}
	}
	if p := r.store(); p.exitErr() != nil {
		r.errs = append(r.errs, fmt.Sprintf("%s did not stop cleanly: %v", p.name, p.exitErr()))
	}
	if b, err := json.MarshalIndent(r.faults, "", "\t"); err == nil {
		_ = os.WriteFile(filepath.Join(logs, "faults.json"), b, 0o644)
	}
	if len(r.errs) > 0 {
		fatal("%s", strings.Join(r.errs, "\n"))
	}
	return res
}

// report is what the checks found.
type report struct {
	overlaps                 []overlap
	crowds                   []crowd // of the semaphore run: more than limit works at once
	unexcusedCrowds          int
	unexcused, unknowable    int
	maxUnexcused, maxExcused time.Duration
	maxUnknowable            time.Duration
	inc                      increments
	restarts, storePauses    int
	pauses, kills            int           // of candidates
	firstWrite               time.Duration // from healing to the first acknowledged increment (0: none)
}

// live reports whether check (3) passed.
func (rep report) live(cfg config) bool {
	return rep.firstWrite > 0 && rep.firstWrite <= cfg.ttl+livenessSlack
}

// check runs the checks on res.
func (res *result) check() report {
	var rep report
	for _, c := range res.cands {
		for _, ev := range c.log {
			if d := time.Duration(ev.T - res.healed); ev.Ev == "inc" && ev.Outcome == "ok" && d > 0 &&
				(rep.firstWrite == 0 || d < rep.firstWrite) {
				rep.firstWrite = d
			}
		}
	}
	var restarts []span
	for _, f := range res.faults {
		switch f.Kind {
		case "store-restart":
			rep.restarts++
			restarts = append(restarts, span{f.From, f.To})
		case "store-pause":
			rep.storePauses++
		case "pause":
			rep.pauses++
		case "kill":
			rep.kills++
		}
	}
	rep.overlaps = findOverlaps(res.cands, restarts, res.cfg.mode == "group")
	if res.cfg.mode == "semaphore" {
		rep.crowds = findCrowds(res.cands, restarts, res.cfg.limit)
		for _, cr := range rep.crowds {
			if !cr.excused && !cr.unknowable {
				rep.unexcusedCrowds++
			}
		}
	}
	for _, o := range rep.overlaps {
		switch {
		case o.excused():
			rep.maxExcused = max(rep.maxExcused, o.length())
		case o.unknowable():
			rep.unknowable++
			rep.maxUnknowable = max(rep.maxUnknowable, o.length())
		default:
			rep.unexcused++
			rep.maxUnexcused = max(rep.maxUnexcused, o.length())
		}
	}
	stores := make([]span, len(res.stores))
	for i, p := range res.stores {
		stores[i] = span{p.started, p.exited}
	}
	if res.cfg.persist && len(stores) > 0 {
		// The counter survives restarts: one lifetime, over them all.
		stores = []span{{stores[0].from, stores[len(stores)-1].to}}
	}
	rep.inc = checkIncrements(res.cands, stores, clock(res.start))
	return rep
}

// log reports the run's figures and every overlap.
func (rep report) log(t *testing.T, res *result) {
	t.Helper()
	c := clock(res.start)
	for _, o := range rep.overlaps {
		t.Log("overlap: " + o.describe(c))
	}
	for _, cr := range rep.crowds {
		t.Log("crowd: " + cr.describe(c))
	}
	for i, v := range rep.inc.violations {
		if i == shownViolations {
			t.Logf("... and %d more violations of check 2", len(rep.inc.violations)-i)
			break
		}
		t.Log("check 2: " + v)
	}
	live := "none"
	if rep.firstWrite > 0 {
		live = rep.firstWrite.Round(time.Millisecond).String()
	}
	t.Logf("seed %d, %v of faults: %d store restarts, %d store pauses, %d candidate pauses, %d candidate kills",
		res.cfg.seed, res.cfg.faultTime, rep.restarts, rep.storePauses, rep.pauses, rep.kills)
	t.Logf("increments: %d acknowledged, %d refused as stale, %d unknown, %d failed reads; %d acknowledged writes were ambiguous between two store lifetimes",
		rep.inc.ok, rep.inc.stale, rep.inc.unknown, rep.inc.readErrors, rep.inc.ambiguous)
	t.Logf("overlaps: %d, of which %d not excused by a pause (the longest %v); the longest excused %v; %d with a process started just after a store restart, which no client can prevent (the longest %v)",
		len(rep.overlaps), rep.unexcused, rep.maxUnexcused, rep.maxExcused, rep.unknowable, rep.maxUnknowable)
	t.Logf("first write after healing: %s (limit TTL + %v = %v)", live, livenessSlack, res.cfg.ttl+livenessSlack)
}

// logFailure reports what a failing run needs to be looked into: its seed,
// its faults and where its logs are (kept after the test).
func (res *result) logFailure(t *testing.T) {
	t.Helper()
	c := clock(res.start)
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d; times are from the start of the faults, %s; healed at %s\nfaults:\n",
		res.cfg.seed, time.Unix(0, res.start).Format(time.RFC3339Nano), c.at(res.healed))
	faults := slices.Clone(res.faults)
	slices.SortFunc(faults, func(a, b fault) int { return cmp.Compare(a.From, b.From) })
	for _, f := range faults {
		fmt.Fprintf(&b, "  %s %-13s %-8s for %v\n", c.at(f.From), f.Kind, f.Target, span{f.From, f.To}.length().Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "logs in %s:\n", res.logs)
	for _, cand := range res.cands {
		fmt.Fprintf(&b, "  %s (events; its own log is %s.log)\n", cand.events, cand.name)
	}
	fmt.Fprintf(&b, "  store.N.log: the store processes' logs; faults.json: the faults, wall clock ns")
	t.Log(b.String())
}
