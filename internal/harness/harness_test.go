package harness_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// regressions are seeds that once found a bug; they run first, every time.
//   - 1084: every candidate had an acquisition's answer dropped just before
//     the faults were healed, and each waited the client's RequestTimeout
//     (10 s) for it: nobody led for 10 s. An acquisition now waits no longer
//     than the renew deadline, after which its answer could promise nothing.
//   - 1152: the leader's read lost its answer, and the harness's work waited
//     the RequestTimeout for it while the term went on. Not a library bug:
//     the work now bounds each request, as a careful user's would.
//   - 1008: a leader's key was deleted by hand while its traffic was held;
//     its own held renewal re-created the key, and the leader went on (as
//     package lock documents). The check's exemption for that needed the
//     observer to see the key come back, which leader.Observe no longer
//     reports, and it flagged "a term outlived its key". Not a library bug:
//     the check now reads the key (TestHeldRenewalRecreatesDeletedKey). Its
//     faults still make this history in about one replay in ten.
//
// Adding the store restart, key deletion and redelivery faults changed the
// draws: 1084 and 1152 no longer replay the sequences that found those
// bugs, but they still run first.
var regressions = []int64{1008, 1084, 1152}

// Timing of every schedule. The lease is short so that a schedule sees
// several takeovers in a few seconds, and long enough that a renewal
// under -race on a loaded machine does not miss its deadline by itself.
const (
	ttl           = 600 * time.Millisecond
	renewInterval = 150 * time.Millisecond
	renewDeadline = 400 * time.Millisecond
	candidates    = 3
	faultPhase    = 3 * time.Second        // faults are injected for this long
	livenessLimit = 5 * time.Second        // a leader must write this soon after the faults are healed (half the client's RequestTimeout)
	maxStall      = 10 * time.Second       // the most time the process stood still that the liveness check gives back
	stopLimit     = 15 * time.Second       // Run must return this soon after its context ends
	slowStop      = 3 * time.Second        // or the schedule's log and visualization are written
	opPace        = 10 * time.Millisecond  // a leader's pause between read-modify-writes
	readPace      = 25 * time.Millisecond  // the observer's pause between reads
	checkLimit    = 60 * time.Second       // porcupine's time limit
	election      = "harness/leader"       // the election key
	register      = "harness/register"     // the shared register
	maxSkew       = 20 * time.Second       // client clock skew and store clock offsets, each way
	restartLimit  = 5 * time.Second        // how long a restarted store may wait for its address to be free
	opTimeout     = 2 * time.Second        // every read and write of the register
	settle        = 300 * time.Millisecond // after the liveness write, before stopping
)

// result is what one schedule did.
type result struct {
	kind                          scheduleKind
	ops, faults, takeovers, stale int
	kinds                         map[string]int // faults injected, by kind
	violations                    []string
	slowStops, overlaps, lateKeys int // reported, not violations
	slowQueue                     int // 1: a semaphore or group schedule took over livenessLimit to recover, within queuedLimit (reported)
	overtaken                     int // the most times an Acquire was overtaken (reported)
}

func envInt(t *testing.T, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// TestHarness runs DSSLOCK_SCHEDULES random fault schedules (20 by default)
// and checks each history; see the package documentation.
func TestHarness(t *testing.T) {
	n := envInt(t, "DSSLOCK_SCHEDULES", 20)
	// A fixed default, so that CI runs the same fault sequences every time;
	// DSSLOCK_SEED explores others.
	first := envInt(t, "DSSLOCK_SEED", 1000)
	if os.Getenv("DSSLOCK_SEED") != "" && os.Getenv("DSSLOCK_SCHEDULES") == "" {
		n = 1 // replay
	}
	parallel := envInt(t, "DSSLOCK_PARALLEL", 4)
	repeat := envInt(t, "DSSLOCK_REPEAT", 0)
	if n < 1 || parallel < 1 || repeat < 0 {
		t.Fatalf("DSSLOCK_SCHEDULES=%d, DSSLOCK_PARALLEL=%d, DSSLOCK_REPEAT=%d: the first two must be at least 1, the last not negative", n, parallel, repeat)
	}
	// A run is a seed and, when it repeats one seed, the repetition's
	// number (from 1; 0 otherwise).
	type run struct{ seed, n int64 }
	var runs []run
	if repeat > 0 {
		// One seed, replayed until the first failure: only its faults are
		// the same every time, the interleavings differ.
		for i := range repeat {
			runs = append(runs, run{first, i + 1})
		}
		t.Logf("seed %d, %d times, %d at once, until the first failure", first, repeat, parallel)
	} else {
		for _, seed := range regressions {
			runs = append(runs, run{seed, 0})
		}
		for i := range n {
			runs = append(runs, run{first + i, 0})
		}
		t.Logf("seeds %d to %d (and %d regression seeds); replay one with DSSLOCK_SEED=<seed> go test -run Harness -v ./internal/harness",
			first, first+n-1, len(regressions))
	}

	var mu sync.Mutex
	var total result
	total.kinds = map[string]int{} // schedules with a fault of the kind
	var byKind [kinds]struct{ runs, failing, violations int }
	stalls := startStallMonitor()
	defer stalls.Stop()
	var failing []string // runName of each run that found violations
	var failed atomic.Bool
	ran := 0
	slots := make(chan struct{}, parallel)
	t.Run("schedules", func(t *testing.T) {
		for _, rn := range runs {
			name := fmt.Sprintf("seed=%d", rn.seed)
			if rn.n > 0 {
				name = fmt.Sprintf("seed=%d/run=%d", rn.seed, rn.n)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				slots <- struct{}{}
				defer func() { <-slots }()
				if repeat > 0 && failed.Load() {
					t.Skip("an earlier run of this seed failed")
				}
				seed := rn.seed
				r := runSchedule(t, seed, rn.n, variant{kind: kindOf(seed)}, stalls)
				if len(r.violations) > 0 {
					failed.Store(true)
				}
				mu.Lock()
				ran++
				if len(r.violations) > 0 {
					failing = append(failing, runName(seed, rn.n))
					byKind[r.kind].failing++
				}
				byKind[r.kind].runs++
				byKind[r.kind].violations += len(r.violations)
				total.ops += r.ops
				total.faults += r.faults
				for k := range r.kinds {
					total.kinds[k]++
				}
				total.takeovers += r.takeovers
				total.stale += r.stale
				total.violations = append(total.violations, r.violations...)
				total.slowStops += r.slowStops
				total.overlaps += r.overlaps
				total.lateKeys += r.lateKeys
				total.slowQueue += r.slowQueue
				total.overtaken = max(total.overtaken, r.overtaken)
				mu.Unlock()
				for _, v := range r.violations {
					t.Errorf("%s: %s", runName(seed, rn.n), v)
				}
				if len(r.violations) > 0 {
					t.Logf("replay: %s", replayCommand(seed))
				}
			})
		}
	})
	t.Logf("schedules with each kind of fault (of %d): %s", ran, kindCounts(total.kinds))
	for k, n := range byKind {
		t.Logf("%s schedules: %d, %d failing, %d violations", scheduleKind(k), n.runs, n.failing, n.violations)
	}
	t.Logf("not violations, but worth a look: %d schedules slow to stop (over %v), %d terms that began before the previous one saw its end, %d keys re-created by held-back requests of their own terms (ended, or going on with no other term between)",
		total.slowStops, slowStop, total.overlaps, total.lateKeys)
	if byKind[kindSemaphore].runs+byKind[kindGroup].runs > 0 {
		t.Logf("not violations, but worth a look: %d semaphore or group schedules recovered in over %v after the faults were healed (within the %v a lost queue message may cost); an Acquire was overtaken at most %d times",
			total.slowQueue, livenessLimit, queuedLimit, total.overtaken)
	}
	line := fmt.Sprintf("harness: %d schedules, %d ops, %d faults, %d takeovers, %d stale rejected, %d violations",
		ran, total.ops, total.faults, total.takeovers, total.stale, len(total.violations))
	if d := stalls.within(time.Time{}, time.Now()); d > 0 {
		t.Logf("the test process stood still for %v in all (pauses over %v)", d.Round(time.Millisecond), stallMin)
	}
	if len(failing) > 0 {
		slices.Sort(failing)
		line += fmt.Sprintf(" (in %s; each schedule's log and history are in %s, and every failure is listed in %s)",
			strings.Join(failing, ", "), os.TempDir(), failuresFile())
	}
	fmt.Println(line)
}

// runName names a run of seed: its seed, and its repetition's number when
// it repeats one seed (DSSLOCK_REPEAT).
func runName(seed, n int64) string {
	if n > 0 {
		return fmt.Sprintf("seed %d (run %d)", seed, n)
	}
	return fmt.Sprintf("seed %d", seed)
}

// replayCommand is the command that replays seed.
func replayCommand(seed int64) string {
	return fmt.Sprintf("DSSLOCK_SEED=%d go test -run Harness -v ./internal/harness (DSSLOCK_REPEAT=200 replays it until it fails)", seed)
}

// failuresFile is where every failing schedule adds its violations, so that
// a run whose output was lost still says what failed.
func failuresFile() string { return filepath.Join(os.TempDir(), "dsslock-harness-failures.log") }

// candidate is one contender: its own client, behind its own proxy. In a
// semaphore schedule it is a participant, in a group schedule a member.
type candidate struct {
	id    string
	lane  int
	c     *sskv.Client
	proxy *faultproxy.Proxy
	skew  atomic.Int64 // its clock's offset, ns
	pause atomic.Int64 // a pause to take before its next write, ns (0: none)
	term  atomic.Pointer[leader.Term]
	works atomic.Int32 // the semaphore's holdings or group's terms whose work runs now
	runs  sync.WaitGroup
}

// leading reports whether the candidate's work runs now: a term, a
// semaphore's holding or one of a group's terms. Faults aim at it first.
func (cd *candidate) leading() bool { return cd.term.Load() != nil || cd.works.Load() > 0 }

// variant changes what a schedule runs: its kind, and how its leaders
// behave, to show that the checks catch what a naive implementation does.
type variant struct {
	kind scheduleKind
	// unfenced leaders write the register without their token.
	unfenced bool
}

// scheduleKind is what a schedule's candidates run.
type scheduleKind int

const (
	// kindElection: candidates campaign with a leader.Elector.
	kindElection scheduleKind = iota
	// kindSemaphore: participants acquire a lock.Semaphore (semaphore_test.go).
	kindSemaphore
	// kindGroup: members split elections with a leader.Group (group_test.go).
	kindGroup
	kinds = iota
)

func (k scheduleKind) String() string {
	return [...]string{"election", "semaphore", "group"}[k]
}

// kindOf is the kind of seed's schedule in TestHarness, so that a seed
// replays the same kind: half the seeds are elections (the regression seeds
// among them), a quarter semaphores, a quarter groups.
func kindOf(seed int64) scheduleKind {
	switch (seed%4 + 4) % 4 {
	case 2:
		return kindSemaphore
	case 3:
		return kindGroup
	}
	return kindElection
}

// schedule is one run: a store, candidates, an observer and a fault loop.
type schedule struct {
	t      *testing.T
	seed   int64
	run    int64 // the repetition of seed (DSSLOCK_REPEAT), from 1; 0: not repeated
	v      variant
	rng    *rand.Rand // the fault loop's only
	h      *history
	cand   []*candidate
	admin  *sskv.Client // the observer's client, not behind a proxy: an administrator's
	log    lockedBuf    // the stores', clients' and history's debug log, and goroutine dumps
	logger *slog.Logger // writes to log

	storeMu sync.Mutex
	srv     *localstore.Server // the store running now; nil while it restarts
	addr    string             // the stores' address, the same for every one
	offset  time.Duration      // the store's clock offset, kept across restarts
	stores  int                // stores started

	failures []string      // of the harness itself (a store that could not restart); the fault loop's only
	stalls   *stallMonitor // when the process stood still; nil: not watched

	observerLane, restartLane int // the history's lanes of the observer and of store restarts, after the candidates'
	// faultKey picks the key the "delete key" fault deletes, from its
	// duration's draw: the election's, a slot's or one of the group's
	// elections.
	faultKey func(d time.Duration) string
}

// store returns the store running now, or nil while it restarts. Faults
// act on it; one that finds none is skipped.
func (s *schedule) store() *localstore.Server {
	s.storeMu.Lock()
	defer s.storeMu.Unlock()
	return s.srv
}

// startStore starts a store on the schedule's address (a free port for the
// first) and makes it the store running now. The new store keeps nothing of
// the one before it but its clock offset: the same machine's clock. Each
// store has its own node id, so that a version tells which store gave it
// (see history.checkTokens).
//
// The address may be briefly taken, by a connection's ephemeral port: it
// tries again for up to restartLimit.
func (s *schedule) startStore() error {
	s.storeMu.Lock()
	addr, offset := s.addr, s.offset
	s.stores++
	node := "statestore"
	if s.stores > 1 {
		node = fmt.Sprintf("statestore%d", s.stores)
	}
	s.storeMu.Unlock()
	cfg := localstore.Config{Addr: addr, NodeID: node, Logger: s.logger.With("store", node)}
	deadline := time.Now().Add(restartLimit)
	for {
		srv, err := localstore.Start(cfg)
		if err == nil {
			srv.SetClockOffset(offset)
			s.h.storeStarted(node)
			s.storeMu.Lock()
			s.srv, s.addr = srv, srv.Addr()
			s.storeMu.Unlock()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("start store %s on %q: %w", node, addr, err)
		}
		s.sleep(context.Background(), 20*time.Millisecond)
	}
}

// stopStore closes the store running now, if any, and returns it.
func (s *schedule) stopStore() *localstore.Server {
	s.storeMu.Lock()
	srv := s.srv
	s.srv = nil
	s.storeMu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	return srv
}

// setClockOffset sets the clock offset of the store running now, and of the
// stores started after it.
func (s *schedule) setClockOffset(srv *localstore.Server, off time.Duration) {
	s.storeMu.Lock()
	s.offset = off
	s.storeMu.Unlock()
	srv.SetClockOffset(off)
}

func runSchedule(t *testing.T, seed, run int64, v variant, stalls *stallMonitor) result {
	s := &schedule{t: t, seed: seed, run: run, v: v, stalls: stalls, rng: rand.New(rand.NewPCG(uint64(seed), 0x64_73_73_6c_6f_63_6b)), h: newHistory()}
	s.logger = slog.New(slog.NewTextHandler(&s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.h.log = s.logger.With("harness", seed)
	s.logger.Info("schedule starts; at= in harness lines is the time since", "seed", seed, "kind", v.kind)
	n := candidates
	s.faultKey = func(time.Duration) string { return election }
	switch v.kind {
	case kindSemaphore:
		n = participants
		s.faultKey = func(d time.Duration) string { return lock.SemaphoreSlot(semaphoreName, int(d/4)%semLimit) }
	case kindGroup:
		n = members
		s.faultKey = func(d time.Duration) string { return groupElections()[int(d/4)%groupSize] }
	}
	s.observerLane, s.restartLane = n, n+1
	res := result{kind: v.kind}
	violate := func(format string, args ...any) {
		res.violations = append(res.violations, fmt.Sprintf(format, args...))
	}

	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	addr := s.store().Addr()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		cd := &candidate{id: fmt.Sprintf("s%d-c%d", seed, i), lane: i}
		var err error
		if cd.proxy, err = faultproxy.Start(addr, faultproxy.Options{}); err != nil {
			t.Fatalf("faultproxy.Start: %v", err)
		}
		defer cd.proxy.Close()
		cd.c, err = sskv.Dial(ctx, sskv.Config{
			Addr: cd.proxy.Addr(), ClientID: cd.id,
			KeepAlive: time.Second, PingTimeout: 500 * time.Millisecond,
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
			WallClock: func() time.Time { return time.Now().Add(time.Duration(cd.skew.Load())) },
			Logger:    s.logger.With("client", cd.id),
		})
		if err != nil {
			t.Fatalf("Dial %s: %v", cd.id, err)
		}
		defer cd.c.Close()
		s.cand = append(s.cand, cd)
	}
	// The observer is not behind a proxy, and no fault aims at it but the
	// store's restarts, after which it reconnects as soon as the candidates.
	// It also deletes keys, as an administrator would.
	observer, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ClientID: fmt.Sprintf("s%d-observer", seed),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Dial observer: %v", err)
	}
	defer observer.Close()
	s.admin = observer
	switch v.kind {
	case kindSemaphore:
		return s.finish(s.runSemaphore(ctx, observer, res))
	case kindGroup:
		return s.finish(s.runGroup(ctx, observer, res))
	}
	s.h.readKey = s.keyReader(ctx)

	// Candidates campaign until runCtx ends; the observer reads and follows
	// the election throughout, from before the first fault.
	runCtx, stop := context.WithCancel(ctx)
	states, err := leader.Observe(runCtx, observer, election)
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	for _, cd := range s.cand {
		e, err := leader.NewElector(cd.c, election, []byte(cd.id), leader.WithCandidateID(cd.id),
			leader.WithTTL(ttl), leader.WithRenewInterval(renewInterval), leader.WithRenewDeadline(renewDeadline),
			leader.WithLogger(s.logger.With("candidate", cd.id)))
		if err != nil {
			t.Fatalf("NewElector: %v", err)
		}
		cd.runs.Go(func() { s.campaign(runCtx, cd, e) })
	}
	var observing sync.WaitGroup
	observing.Go(func() { s.observe(runCtx, observer) })
	observing.Go(func() {
		for st := range states {
			s.h.observed(st)
		}
	})

	// Faults, then healing, then a leader must write again.
	res.kinds = s.injectFaults(runCtx)
	for _, n := range res.kinds {
		res.faults += n
	}
	res.violations = append(res.violations, s.failures...)
	healed, healedAt := s.h.now(), time.Now()
	wrote := s.waitWrite(runCtx, healed, livenessLimit)
	// Time the process itself stood still (see stallMonitor) is given
	// back, up to maxStall: the library cannot act while it does not run.
	stalled := s.stalls.within(healedAt, time.Now())
	for !wrote && stalled > 0 && stalled <= maxStall {
		wait := time.Until(healedAt.Add(livenessLimit + stalled))
		if wait <= 0 {
			break
		}
		wrote = s.waitWrite(runCtx, healed, wait)
		stalled = s.stalls.within(healedAt, time.Now())
	}
	if !wrote {
		st, err := leader.Leader(ctx, observer, election)
		violate("no leader wrote within %v after the faults were healed, and the %v the test process stood still meanwhile (election: %+v, %v)",
			livenessLimit, stalled.Round(time.Millisecond), st, err)
		s.dumpGoroutines()
	}
	if stalled > 0 {
		s.logger.Info("the test process stood still after the faults were healed", "harness", s.seed, "for", stalled)
	}
	recovered := time.Duration(s.h.now() - healed)
	s.sleep(runCtx, settle)

	stop()
	stopping := time.Now()
	slow := false
	for _, cd := range s.cand {
		if !slow && !waitGroup(&cd.runs, slowStop) {
			slow = true
			t.Logf("%s: Elector.Run is slow to return after its context ended", cd.id)
			s.dumpGoroutines()
		}
		if !waitGroup(&cd.runs, stopLimit) {
			violate("%s: Elector.Run did not return within %v of its context's end", cd.id, stopLimit)
			cd.c.Close() // unblock it, so the schedule can end
			cd.runs.Wait()
		}
	}
	observing.Wait()
	stopped := time.Since(stopping)
	// The final state, read by a client that saw no fault.
	call := s.h.now()
	g, err := observer.Get(ctx, register)
	s.h.read(s.observerLane, call, g, err)
	if err != nil {
		violate("final read: %v", err)
	}

	s.h.mu.Lock()
	res.ops = s.h.invoked
	res.stale = s.h.stale
	res.takeovers = max(0, len(s.h.terms)-1)
	ops := append([]porcupine.Operation(nil), s.h.ops...)
	unknown, notSent, refused := s.h.unknown, s.h.notSent, s.h.refused
	s.h.mu.Unlock()
	res.violations = append(res.violations, s.h.checkTokens()...)
	observed, late := s.h.checkObserver()
	res.violations = append(res.violations, observed...)
	res.lateKeys = len(late)
	for _, l := range late {
		t.Logf("not a violation: %s", l)
	}
	check, info := porcupine.CheckOperationsVerbose(registerModel, ops, checkLimit)
	switch check {
	case porcupine.Illegal:
		violate("the register's history is not linearizable")
	case porcupine.Unknown:
		violate("porcupine could not decide linearizability within %v (%d operations)", checkLimit, len(ops))
	}
	overlaps, longest := s.h.overlaps()
	res.overlaps = overlaps
	if slow {
		res.slowStops = 1
	}
	summary := fmt.Sprintf("%d ops (%d in history: %d of unknown outcome), %d faults, %d terms, %d stale rejected, %d not sent after a term ended, %d other refusals; %d believed terms overlapped (longest %v); a leader wrote %v after healing; stopped in %v; linearizable: %s; %d states observed; %d violations",
		res.ops, len(ops), unknown, res.faults, len(s.h.terms), res.stale, notSent, refused, overlaps, longest,
		recovered.Round(time.Millisecond), stopped.Round(time.Millisecond), check, s.h.observedStates(), len(res.violations))
	return s.finish(res, info, summary, slow)
}

// finish logs the schedule's summary and, if it found violations or was
// slow to stop, writes its evidence: the log and the visualization.
func (s *schedule) finish(res result, info porcupine.LinearizationInfo, summary string, slow bool) result {
	s.t.Log(summary)
	if len(res.violations) > 0 || slow || res.slowQueue > 0 || os.Getenv("DSSLOCK_VISUALIZE") != "" {
		s.evidence(res.violations, summary)
		html := s.visualize(info, res.violations, summary)
		logPath := s.writeLog()
		if len(res.violations) > 0 && !s.v.unfenced { // a variant's are wanted (see TestHarnessCatchesUnfencedWrites)
			s.recordFailure(res.violations, html, logPath)
		}
	}
	return res
}

// evidence ends the schedule's log with its violations, each with the
// events its check was judged on, and its summary: a log kept without the
// test's output still says what failed.
func (s *schedule) evidence(violations []string, summary string) {
	name := runName(s.seed, s.run)
	fmt.Fprintf(&s.log, "\n--- %s: %d violations; each is the check that fired, and the events it was judged on ---\n", name, len(violations))
	for i, v := range violations {
		fmt.Fprintf(&s.log, "violation %d of %d: %s\n", i+1, len(violations), v)
	}
	fmt.Fprintf(&s.log, "--- %s: %s ---\nreplay: %s\n", name, summary, replayCommand(s.seed))
}

// recordFailure adds the schedule's violations, and where its evidence is,
// to failuresFile.
func (s *schedule) recordFailure(violations []string, html, logPath string) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d violations; history %s, log %s; replay: %s\n",
		time.Now().UTC().Format(time.RFC3339), runName(s.seed, s.run), len(violations), html, logPath, replayCommand(s.seed))
	for _, v := range violations {
		fmt.Fprintf(&b, "  %s\n", strings.ReplaceAll(v, "\n", "\n  "))
	}
	f, err := os.OpenFile(failuresFile(), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString(b.String())
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		s.t.Logf("failures file: %v", err)
	}
}

// fileName is the name of the schedule's files in os.TempDir, with ext.
func (s *schedule) fileName(ext string) string {
	if s.run > 0 {
		return filepath.Join(os.TempDir(), fmt.Sprintf("dsslock-harness-%d-%d.%s", s.seed, s.run, ext))
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("dsslock-harness-%d.%s", s.seed, ext))
}

// keyReader returns the history's readKey: it reads the election's key
// with the administrator's client, within ctx and opTimeout.
func (s *schedule) keyReader(ctx context.Context) func() (hlc.Timestamp, string, error) {
	return func() (hlc.Timestamp, string, error) {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		g, err := s.admin.Get(rctx, election)
		if err != nil {
			return hlc.Timestamp{}, "", err
		}
		if !g.Found {
			return hlc.Timestamp{}, "missing", nil
		}
		h := lock.ParseHolder(g.Value, g.Version)
		return h.Token, fmt.Sprintf("%s's record with token %v, at version %v", h.ID, h.Token, g.Version), nil
	}
}

// kindCounts formats counts by fault kind, in the order of faultKinds.
func kindCounts(n map[string]int) string {
	var b strings.Builder
	for _, k := range faultKinds {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k.name, n[k.name])
	}
	return b.String()
}

// campaign runs the candidate's Elector until ctx ends. Run returns early
// only on an error a user would retry after a pause (a refused campaign,
// e.g. a clock too far ahead); the candidate then tries again.
func (s *schedule) campaign(ctx context.Context, cd *candidate, e *leader.Elector) {
	for ctx.Err() == nil {
		err := e.Run(ctx, func(ctx context.Context, t *leader.Term) error {
			return s.lead(ctx, cd, t)
		})
		if err != nil && ctx.Err() == nil {
			s.t.Logf("%s: Run: %v; campaigning again", cd.id, err)
			s.sleep(ctx, ttl)
		}
	}
}

// lead is a term's work: read-modify-write the register, fenced, until the
// term ends. A pending pause fault stops it between the read and the write
// for longer than the renew deadline, as a stopped process would be, with
// its traffic held; it then writes with the token it had before the pause,
// not knowing whether it still leads.
func (s *schedule) lead(ctx context.Context, cd *candidate, t *leader.Term) error {
	rec := s.h.termStarted(cd.lane, cd.id, t.Token(), func() bool {
		_, err := t.FencingToken()
		return err == nil
	})
	defer s.h.termEnded(rec)
	cd.term.Store(t)
	defer cd.term.Store(nil)
	w := fenced.New(cd.c, t)
	for n := 0; ctx.Err() == nil; n++ {
		// Each request is bounded, as a careful user bounds it: a lost
		// answer would otherwise hold the work for the client's
		// RequestTimeout while the term goes on (seed 1152).
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := s.h.now()
		g, err := cd.c.Get(rctx, register)
		cancel()
		s.h.read(cd.lane, call, g, err)
		if err != nil {
			s.sleep(ctx, opPace)
			continue
		}
		value := fmt.Sprintf("%s/%d/%d", cd.id, t.Token().Wall%100000, n)
		if d := time.Duration(cd.pause.Swap(0)); d > 0 {
			tok, err := t.FencingToken()
			if err != nil {
				return nil // the term ended already
			}
			start := s.h.now()
			s.h.markPaused(rec)
			srv := s.store()
			if srv != nil {
				_ = srv.Hold(cd.id, localstore.Both)
			}
			time.Sleep(d) // the pause itself: nothing of this process runs
			if srv != nil {
				srv.Release(cd.id)
			}
			s.h.fault(start, s.h.now(), fmt.Sprintf("pause %s %v", cd.id, d.Round(time.Millisecond)))
			if srv != nil {
				s.h.delayed(cd.id, start, s.h.now())
			}
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			call := s.h.now()
			opts := sskv.SetOptions{FencingToken: tok}
			if s.v.unfenced {
				opts.FencingToken = hlc.Timestamp{}
			}
			r, err := cd.c.Set(wctx, register, []byte(value), opts)
			cancel()
			s.h.write(cd.lane, cd.id, value, tok, true, call, r, err)
			continue
		}
		tok := t.Token()
		call = s.h.now()
		var r sskv.SetResult
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		if s.v.unfenced {
			r, err = cd.c.Set(wctx, register, []byte(value), sskv.SetOptions{})
		} else {
			r, err = w.Set(wctx, register, []byte(value), sskv.SetOptions{})
		}
		cancel()
		s.h.write(cd.lane, cd.id, value, tok, false, call, r, err)
		s.sleep(ctx, opPace)
	}
	return nil
}

// observe reads the register until ctx ends.
func (s *schedule) observe(ctx context.Context, c *sskv.Client) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		call := s.h.now()
		g, err := c.Get(rctx, register)
		cancel()
		s.h.read(s.observerLane, call, g, err)
		s.sleep(ctx, readPace)
	}
}

// sleep waits d or until ctx ends. It paces loops; nothing waits on it.
func (s *schedule) sleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}

// waitWrite waits until a write is accepted after time since, for at most limit.
func (s *schedule) waitWrite(ctx context.Context, since int64, limit time.Duration) bool {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		next, ok := s.h.wroteSince(since)
		if ok {
			return true
		}
		select {
		case <-next:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func waitGroup(wg *sync.WaitGroup, limit time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(limit):
		return false
	}
}

// visualize writes porcupine's visualization of the history, with terms,
// faults, the violations and the summary, logs its path and returns it.
func (s *schedule) visualize(info porcupine.LinearizationInfo, violations []string, summary string) string {
	s.h.mu.Lock()
	ann := append([]porcupine.Annotation(nil), s.h.annotations...)
	for _, r := range s.h.terms {
		end := r.end
		if end == 0 {
			end = s.h.now()
		}
		ann = append(ann, porcupine.Annotation{ClientId: r.lane, Start: r.start, End: end,
			Description: "term " + r.token.String(), BackgroundColor: "#d5f0d5"})
	}
	s.h.mu.Unlock()
	end := s.h.now()
	for i, v := range violations {
		head, _, _ := strings.Cut(v, "\n")
		ann = append(ann, porcupine.Annotation{Tag: "violations", Start: 0, End: end,
			Description: fmt.Sprintf("violation %d of %d: %s", i+1, len(violations), head), Details: v, BackgroundColor: "#f08080"})
	}
	ann = append(ann, porcupine.Annotation{Tag: "summary", Start: 0, End: end,
		Description: runName(s.seed, s.run) + ": " + summary, Details: summary, BackgroundColor: "#e0e0e0"})
	info.AddAnnotations(ann)
	path := s.fileName("html")
	if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
		s.t.Logf("visualization: %v", err)
		return ""
	}
	s.t.Logf("history of %s: %s", runName(s.seed, s.run), path)
	return path
}

// dumpGoroutines appends the stacks of all goroutines to the schedule's log.
func (s *schedule) dumpGoroutines() {
	fmt.Fprintf(&s.log, "\n--- goroutines of all running schedules at %v ---\n", time.Duration(s.h.now()))
	_ = pprof.Lookup("goroutine").WriteTo(&s.log, 1)
}

// writeLog writes the schedule's log next to its visualization, and
// returns its path.
func (s *schedule) writeLog() string {
	path := s.fileName("log")
	if err := os.WriteFile(path, s.log.Bytes(), 0o644); err != nil {
		s.t.Logf("log: %v", err)
		return ""
	}
	s.t.Logf("log of %s: %s", runName(s.seed, s.run), path)
	return path
}

// lockedBuf is a buffer safe for concurrent writes.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}
