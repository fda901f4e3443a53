// Package harness is dsslock's randomized fault harness. It has no API: it
// is a test (TestHarness in this directory), kept apart from the packages
// it exercises.
//
// Each schedule starts a local state store and a few candidates (each its own
// sskv client, behind its own TCP fault proxy) that campaign with a
// leader.Elector. While leading, a candidate performs read-modify-write
// operations on one shared register key, its writes fenced with its term's
// token. A second goroutine injects random faults, drawn from the schedule's
// seed: a leader paused past its renew deadline that then writes with its
// old token, kicked and dropped connections, blackholed and cut network
// paths, held traffic, held, delayed and dropped responses, network delay,
// store clock jumps within the allowed skew, and clients with skewed clocks.
//
// Every operation's invocation and response is recorded, and the history is
// checked:
//
//   - with porcupine against a register model (reads and writes of the
//     register are linearizable; a refused write never took effect; a write
//     whose outcome is unknown may have taken effect at any time after its
//     invocation);
//   - accepted writes, in the store's version order, carry non-decreasing
//     fencing tokens, so no two terms' writes interleave;
//   - after the faults are healed, a leader is elected and writes again
//     within 5 s, half the client's RequestTimeout: nothing on the way to
//     leadership may wait out a lost answer.
//
// A failing schedule prints its seed and the command that replays it, and
// writes porcupine's HTML visualization of its history (with faults and
// terms annotated) and the store's debug log to files whose paths it
// prints; so does a schedule whose candidates are slow to stop (with the
// goroutines' stacks in the log). The seed fixes the sequence of faults
// drawn; the interleavings are the machine's, so a replay runs the same
// faults, not the same history.
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
