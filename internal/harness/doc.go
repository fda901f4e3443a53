// Package harness is dsslock's randomized fault harness. It has no API: it
// is a test (TestHarness in this directory), kept apart from the packages
// it exercises.
//
// Each schedule starts a local state store and a few candidates (each its own
// sskv client, behind its own TCP fault proxy) that campaign with a
// leader.Elector. While leading, a candidate performs read-modify-write
// operations on one shared register key, its writes fenced with its term's
// token. An observer reads the register and follows the election with
// leader.Observe. A second goroutine injects random faults, drawn from the
// schedule's seed: a leader paused past its renew deadline that then writes
// with its old token, kicked and dropped connections, blackholed and cut
// network paths, held traffic, held, delayed and dropped responses, network
// delay, store clock jumps within the allowed skew, clients with skewed
// clocks, and:
//
//   - store restarts: the store is closed, losing every key and session, and
//     a new one starts on the same address 0.1 to 2.5 s later (short ones
//     drawn more often; with the same clock offset and a node id of its
//     own); every client reconnects;
//   - the election's key deleted by hand while its leader is away: the
//     leader's connection is blackholed or held, an administrator's client
//     deletes the key with a DEL fenced with the token its record holds,
//     another candidate may take over, and then the connection heals
//     (delivering what it held) or is cut (the leader reconnects and sends
//     its unacknowledged requests again);
//   - requests sent again on a resumed session: the traffic from the store to
//     the leader is held for 0.15 to 0.75 s, so that its requests are
//     executed and stay unacknowledged (and its term often ends meanwhile),
//     and then its connection is dropped; the client resumes its session and
//     sends them again (QoS 1), and the store executes them again.
//
// Every operation's invocation and response is recorded, and the history is
// checked:
//
//   - with porcupine against a register model (reads and writes of the
//     register are linearizable; a refused write never took effect; a write
//     whose outcome is unknown may have taken effect at any time after its
//     invocation; a store restart loses the register at some time between
//     the old store's Close and the new store's start);
//   - accepted writes, in the store's version order, carry non-decreasing
//     fencing tokens, so no two terms' writes interleave. A restarted store's
//     clock may be behind its predecessor's versions, so versions and tokens
//     are ordered by store first: no term of an earlier store may write after
//     a term of a later one has (but a paused leader's late write, which only
//     the lost fence stood in the way of);
//   - a term whose key the observer saw deleted or taken, or that led when
//     the store was closed, must stop leading within the renew deadline (and
//     100 ms): a renewal sent after that can only have succeeded by
//     re-creating the key. Counted, not a violation: a key deleted by hand
//     while a fault held up a renewal of its own, which then re-created it,
//     with no other term seen in between (the library documents it: the
//     holder cannot tell that renewal from any other, and the deletion's
//     notification was held up with it, or folded into its watch's Resync
//     after a reconnect). leader.Observe does not report the re-created key
//     (it does not report again a term it saw end), so the check reads the
//     key when it finds such a term still leading: it must hold that term's
//     own record (seed 1008, TestHeldRenewalRecreatesDeletedKey);
//   - the observer never sees a term token go back: a leader whose token is
//     not above every token seen before (in store order) must have stopped
//     leading within the renew deadline of a newer term's, or of its own key
//     gone. If it had, a late request of the ended term re-created its key:
//     the library documents that for requests delayed in the network, so it
//     is counted, not a violation, when a fault held back or slowed down that
//     candidate's requests then; when none did, the client re-created the key
//     by itself (a request sent again on a resumed session, or sent not
//     knowing the key was gone), and it is one;
//   - after the faults are healed, a leader is elected and writes again
//     within 5 s, half the client's RequestTimeout: nothing on the way to
//     leadership may wait out a lost answer. Time the test process itself
//     stood still meanwhile (a goroutine that ticks every 10 ms measures
//     it; a machine shared with heavier jobs can stop the process for
//     seconds) is added to the 5 s, up to 10 s, and the violation says how
//     much there was.
//
// Half the seeds run elections as above; a quarter (seed mod 4 = 2) run a
// lock.Semaphore, and a quarter (seed mod 4 = 3) a leader.Group, under the
// same faults (the "delete key" fault deletes a slot's key, or one of the
// group's elections'), so that a seed replays the same kind:
//
//   - a semaphore schedule: 4 participants acquire a semaphore of limit 2,
//     and each holding's work read-modify-writes its slot's register a few
//     times, fenced with the holding's token, before its Release
//     (semaphore_test.go);
//   - a group schedule: 3 members split 6 elections, and each term's work
//     read-modify-writes its election's register, fenced, until the term
//     ends or is handed over (group_test.go).
//
// Their histories are checked with porcupine, partitioned by register, and
// by the token order of each register's accepted writes, as above; a
// holding (or term) held when the store was closed must end within the
// renew deadline, as a term must; and by the windows of the holdings: each
// from the start of its work to the last time the library said it still
// held, for a write the store then accepted. At most Limit windows may
// overlap at any moment, and no two of one slot (or election); a write
// within the renew deadline of a deletion of the holding's key by hand does
// not extend its window (the holder cannot know of it sooner; fencing is
// what keeps the register safe meanwhile). After the faults are healed,
// every member of a group must see every other within 5 s (joining takes
// a free slot, and waits in no queue); every participant must write again,
// and every election's work, and the members' shares (the election keys
// each holds, read from the store) must be within one of each other, within
// 8.6 s: a waiter in a lock's queue may lose a message, and then waits for
// its recheck, about 11 TTLs (docs/design/queue.md, L7), and a few
// handovers. Taking more than 5 s is reported, not a violation, and keeps
// the schedule's log, with the goroutines' stacks at 5 s. The shares must
// still be even a moment later (or, if the test process stood still
// meanwhile, even again within 8.6 s after that). How often an Acquire
// was overtaken is reported too.
//
// Three tests (lostanswer_test.go) force, in 10 s each, the lost answers
// that the semaphore and group schedules found waited out for the client's
// RequestTimeout: a Group member's TryLock after a reconnect, a
// Semaphore's read of its record, and a watch's registration after a
// reconnect. They fail until those waits are bounded.
//
// A failing schedule prints its seed and the command that replays it, and
// writes porcupine's HTML visualization of its history (with faults, terms
// and observed step backs annotated) and a debug log (the stores', the
// clients' and electors', and a line for each fault, term and observed
// state) to files whose paths it prints, in os.TempDir:
// dsslock-harness-<seed>.html and .log (dsslock-harness-<seed>-<run>.* for
// a run of DSSLOCK_REPEAT); so does a schedule whose candidates are slow to
// stop (with the goroutines' stacks in the log). The evidence does not
// depend on the test's output being kept:
//
//   - the log ends with each violation's full text, the check that fired
//     and, for the observer's checks, the events it was judged on (the
//     term, the states observed around it, the candidate's faults and the
//     times its requests were held back, what the key held when checked),
//     then the schedule's summary line and the command that replays it;
//   - the visualization has the violations and the summary as annotations
//     of their own (the full text in each one's details);
//   - every failing schedule adds its violations, and the paths of its
//     files, to dsslock-harness-failures.log in os.TempDir, which is never
//     truncated;
//   - the last line of the output names the failing seeds.
//
// The seed fixes the sequence of faults drawn; the interleavings are the
// machine's, so a replay runs the same faults, not the same history. A
// failure that is rare on replay is best hunted with DSSLOCK_REPEAT, which
// replays one seed many times, DSSLOCK_PARALLEL at once, and stops at the
// first failure (the runs already under way finish; the others are
// skipped), keeping that run's evidence as above:
//
//	go test ./internal/harness                                   # 20 schedules
//	DSSLOCK_SCHEDULES=200 go test -run Harness -v ./internal/harness
//	DSSLOCK_SEED=1234 go test -run Harness -v ./internal/harness  # replay one
//	DSSLOCK_SEED=1234 DSSLOCK_REPEAT=500 DSSLOCK_PARALLEL=3 \
//		go test -run 'TestHarness$' -v -timeout 2h ./internal/harness # until it fails
//
// TestRWMutexHarness runs participants of a lock.RWMutex, each behind a
// fault proxy, under random blackholes, partitions, cuts, delay and store
// restarts, and checks their holdings with the RWMutex's own oracle: no
// holding beside a writer's, and tokens ordered (docs/design/rwmutex.md).
// DSSLOCK_RW_SCHEDULES sets how many schedules it runs (default 3).
//
// Environment: DSSLOCK_SCHEDULES (default 20); DSSLOCK_SEED (the first seed;
// default 1000, so that CI runs the same fault sequences every time);
// DSSLOCK_PARALLEL (schedules run at once, default 4: they mostly wait on
// timers; on a shared or small machine, fewer, as a loaded machine changes
// the interleavings); DSSLOCK_REPEAT (replay DSSLOCK_SEED this many times,
// until the first failure; the regression seeds do not run);
// DSSLOCK_VISUALIZE=1 (write the visualization of every schedule, not only
// failing ones).
package harness
