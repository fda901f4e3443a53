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
//     holder cannot tell that renewal from any other);
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
//     leadership may wait out a lost answer.
//
// A failing schedule prints its seed and the command that replays it, and
// writes porcupine's HTML visualization of its history (with faults, terms
// and observed step backs annotated) and a debug log (the stores', the
// clients' and electors', and a line for each fault, term and observed
// state) to files whose paths it prints; so does a schedule whose
// candidates are slow to stop (with the goroutines' stacks in the log). The
// seed fixes the sequence of faults drawn; the interleavings are the
// machine's, so a replay runs the same faults, not the same history.
//
//	go test ./internal/harness                                   # 20 schedules
//	DSSLOCK_SCHEDULES=200 go test -run Harness -v ./internal/harness
//	DSSLOCK_SEED=1234 go test -run Harness -v ./internal/harness  # replay one
//
// Environment: DSSLOCK_SCHEDULES (default 20); DSSLOCK_SEED (the first seed;
// default 1000, so that CI runs the same fault sequences every time);
// DSSLOCK_PARALLEL (schedules run at once, default 4: they mostly wait on
// timers); DSSLOCK_VISUALIZE=1 (write the visualization of every schedule,
// not only failing ones).
package harness
