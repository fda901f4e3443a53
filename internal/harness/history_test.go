package harness_test

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// The register: one key, read and written with unconditional SETs. Its model
// state is the key's value; "" is a missing key (nobody writes ""). A store
// restart loses every key: it is a write of "" at some time between the
// old store's Close and the new store's start. A schedule of semaphore or
// group holdings has a register for each slot or election: the model is
// partitioned by key, and a restart is in every partition.
type regOp struct {
	key     string // the register; "" for a restart, which loses them all
	write   bool
	value   string // the value written
	restart bool   // a store restart: a write of "", by nobody
}

type regOut struct {
	value string // the value read
}

var registerModel = porcupine.Model{
	Partition: partitionByKey,
	Init:      func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regOp)
		if in.write {
			return true, in.value
		}
		return output.(regOut).value == state.(string), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(regOp)
		if in.restart {
			return "store restart: every key lost"
		}
		key := ""
		if in.key != register {
			key = in.key + ": "
		}
		if in.write {
			if output == nil {
				return fmt.Sprintf("%sset(%q) -> ?", key, in.value)
			}
			return fmt.Sprintf("%sset(%q)", key, in.value)
		}
		return fmt.Sprintf("%sget() -> %q", key, output.(regOut).value)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
}

// partitionByKey splits a history by register; each store restart, which
// loses every register, is in every part.
func partitionByKey(ops []porcupine.Operation) [][]porcupine.Operation {
	var restarts []porcupine.Operation
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range ops {
		k := op.Input.(regOp).key
		if op.Input.(regOp).restart {
			restarts = append(restarts, op)
			continue
		}
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	if len(keys) == 0 {
		return [][]porcupine.Operation{ops}
	}
	slices.Sort(keys)
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, append(byKey[k], restarts...))
	}
	return parts
}

// unknownReturn is the return time of an operation whose outcome is
// unknown: it may take effect at any time after its call.
const unknownReturn = math.MaxInt64

// ackedWrite is a write of the register the store accepted.
type ackedWrite struct {
	key     string        // the register written
	version hlc.Timestamp // the key's version it made; its node names the store
	token   hlc.Timestamp // the fencing token it carried
	who     string        // candidate
	paused  bool          // written after a pause, with the token from before it
}

// termRecord is one term of a candidate, as its work saw it.
type termRecord struct {
	who        string
	lane       int
	token      hlc.Timestamp
	start, end int64       // work started; work saw its context end (0: not yet)
	paused     bool        // its work was paused (and so saw the end late)
	live       func() bool // whether the term still leads
}

// history records one schedule: operations for porcupine, accepted writes
// for the token check, terms and faults for the report and visualization.
type history struct {
	start time.Time

	mu          sync.Mutex
	ops         []porcupine.Operation
	invoked     int
	acked       []ackedWrite
	lastAcked   int64 // time of the last accepted write
	stale       int   // writes the store refused for an older token
	notSent     int   // writes the Writer did not send: its term had ended
	refused     int   // other store refusals
	unknown     int   // writes of unknown outcome
	terms       []*termRecord
	annotations []porcupine.Annotation
	wrote       chan struct{} // closed and replaced on each accepted write
	stores      []string      // the node id of each store started, in order

	obs       observations          // the election's states, as the observer got them
	lossGrace time.Duration         // see observations
	log       *slog.Logger          // a line for each fault, term and observed state
	delays    map[string][][2]int64 // by candidate: when faults held back or slowed its requests
	// readKey reads the election's key: the token its record holds (zero
	// if none), and what it holds, said for a report. nil: not read.
	readKey func() (hlc.Timestamp, string, error)

	// Of semaphore and group schedules (see holding):
	holdings          []*holding
	deleted           map[hlc.Timestamp][][2]int64 // by token: when a key held with it was deleted by hand
	lastConfirmed     map[string]int64             // by candidate: the last time a holding of its was confirmed
	lastConfirmedSlot map[string]int64             // the same by slot or election
	acquisitions      []acquisition                // a semaphore's Acquire calls that returned nil
}

func newHistory() *history {
	return &history{start: time.Now(), wrote: make(chan struct{}), lossGrace: lossGrace, log: slog.New(slog.DiscardHandler),
		delays: map[string][][2]int64{}, deleted: map[hlc.Timestamp][][2]int64{},
		lastConfirmed: map[string]int64{}, lastConfirmedSlot: map[string]int64{},
		obs: observations{seen: map[hlc.Timestamp]int64{}, gone: map[hlc.Timestamp]int64{}, back: map[hlc.Timestamp]bool{}}}
}

// now is the time since the schedule began, on the monotonic clock.
func (h *history) now() int64 { return int64(time.Since(h.start)) }

// read records a read of the register; failed reads had no effect and are
// not part of the history.
func (h *history) read(lane int, call int64, res sskv.GetResult, err error) {
	h.readOf(register, lane, call, res, err)
}

// readOf is read, of the register key.
func (h *history) readOf(key string, lane int, call int64, res sskv.GetResult, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.invoked++
	if err != nil {
		return
	}
	h.ops = append(h.ops, porcupine.Operation{ClientId: lane, Input: regOp{key: key}, Call: call,
		Output: regOut{value: string(res.Value)}, Return: h.now()})
}

// write records a write of value with token, and classifies its outcome.
func (h *history) write(lane int, who string, value string, token hlc.Timestamp, paused bool, call int64, res sskv.SetResult, err error) {
	h.writeOf(register, lane, who, value, token, paused, call, res, err)
}

// writeOf is write, of the register key; it reports whether the store
// accepted the write.
func (h *history) writeOf(key string, lane int, who string, value string, token hlc.Timestamp, paused bool, call int64, res sskv.SetResult, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.invoked++
	op := porcupine.Operation{ClientId: lane, Input: regOp{key: key, write: true, value: value}, Call: call, Metadata: who}
	var se *sskv.ServiceError
	switch {
	case err == nil:
		op.Return = h.now()
		op.Output = regOut{}
		h.ops = append(h.ops, op)
		h.acked = append(h.acked, ackedWrite{key: key, version: res.Version, token: token, who: who, paused: paused})
		h.lastAcked = op.Return
		close(h.wrote)
		h.wrote = make(chan struct{})
		return true
	case errors.As(err, &se):
		// The store answered -ERR: the write did not take effect.
		if errors.Is(err, sskv.ErrFencingTokenLower) {
			h.stale++
		} else {
			h.refused++
		}
	case errors.Is(err, fenced.ErrStale):
		h.notSent++ // the term had ended; nothing was sent
	case errors.Is(err, sskv.ErrPublishRejected):
		h.refused++
	default:
		// Timed out, connection lost, term ended while in flight: it may
		// have taken effect, at any time from its call on.
		h.unknown++
		op.Return = unknownReturn
		h.ops = append(h.ops, op)
	}
	return false
}

// storeStarted records a store that starts with node id node: the versions
// it gives come after those of the stores started before it, whatever
// their clocks say.
func (h *history) storeStarted(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stores = append(h.stores, node)
}

// restarted records a store restart that began at call (the old store's
// Close) and ended at ret (the new store's start): the register was lost at
// some time in between.
func (h *history) restarted(lane int, call, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: lane, Input: regOp{write: true, restart: true},
		Output: regOut{}, Call: call, Return: ret})
}

// wroteSince returns a channel closed by the next accepted write, and
// whether a write was accepted after t already.
func (h *history) wroteSince(t int64) (<-chan struct{}, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wrote, h.lastAcked > t
}

// termStarted records a term whose work starts now; live reports whether it
// still leads.
func (h *history) termStarted(lane int, who string, token hlc.Timestamp, live func() bool) *termRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &termRecord{who: who, lane: lane, token: token, start: h.now(), live: live}
	h.terms = append(h.terms, r)
	h.log.Info("term's work starts", "at", time.Duration(r.start), "candidate", who, "token", token)
	return r
}

func (h *history) termEnded(r *termRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.end = h.now()
	h.log.Info("term's work ends", "at", time.Duration(r.end), "candidate", r.who, "token", r.token)
}

func (h *history) markPaused(r *termRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.paused = true
}

// fault records a fault for the visualization; end 0 means an instant.
func (h *history) fault(start, end int64, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.annotations = append(h.annotations, porcupine.Annotation{Tag: "faults", Start: start, End: end,
		Description: what, BackgroundColor: "#fbd5b5"})
	h.log.Info("fault", "at", time.Duration(start), "until", time.Duration(end), "what", what)
}

// delayed records that a fault held back or slowed down who's requests to
// the store from start to end, when it delivered them.
func (h *history) delayed(who string, start, end int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.delays[who] = append(h.delays[who], [2]int64{start, end})
}

// lateDelivery is how long after a fault delivered the requests it held
// back their effects may be seen.
const lateDelivery = 200 * time.Millisecond

// delayedAt reports whether a request of who's that took effect at t (as
// the observer saw it) may have been held back or slowed down by a fault.
func (h *history) delayedAt(who string, t int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, d := range h.delays[who] {
		if d[0] <= t && t <= d[1]+int64(lateDelivery) {
			return true
		}
	}
	return false
}

// annotate marks an event on a lane of the visualization; end 0 means an
// instant.
func (h *history) annotate(lane int, start, end int64, what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.annotations = append(h.annotations, porcupine.Annotation{ClientId: lane, Start: start, End: end,
		Description: what, BackgroundColor: "#f5b5b5"})
}

// storeOrder returns how the stores started so far order versions and
// tokens: by store first, in the order the stores started (a version's node
// names its store), then by version. A restarted store's clock may be behind
// the versions its predecessor gave (its clock may have stepped back, or
// clients' clocks ahead may have pushed the old store's), and a candidate
// that never saw the last term's token cannot push the new store past it:
// the store's order is the only one that holds across a restart.
func (h *history) storeOrder() func(a, b hlc.Timestamp) int {
	h.mu.Lock()
	store := make(map[string]int, len(h.stores))
	for i, node := range h.stores {
		store[node] = i
	}
	h.mu.Unlock()
	return func(a, b hlc.Timestamp) int {
		return cmp.Or(cmp.Compare(store[a.Node], store[b.Node]), a.Compare(b))
	}
}

// checkTokens returns the violations of the token order: accepted writes,
// in the store's version order, must carry non-decreasing tokens (so the
// writes of two terms never interleave), and a token is one candidate's.
// Across store restarts, versions and tokens are ordered by store first
// (see storeOrder): a term of an earlier store must not write after a term
// of a later one has. A write sent after a pause, with a token from an
// earlier store than the one that accepted it, is left out: the register's
// fence, lost with that store, was all that stood in its way.
// Each register is checked on its own (a semaphore or group schedule has
// one for each slot or election, written with that slot's or election's
// tokens).
func (h *history) checkTokens() []string {
	h.mu.Lock()
	acked := slices.Clone(h.acked)
	h.mu.Unlock()
	order := h.storeOrder()
	slices.SortFunc(acked, func(a, b ackedWrite) int { return order(a.version, b.version) })
	var v []string
	for i := 1; i < len(acked); i++ {
		if acked[i].version.Compare(acked[i-1].version) == 0 {
			v = append(v, fmt.Sprintf("two accepted writes have version %v", acked[i].version))
		}
	}
	// Each register is fenced on its own: the writes of one key are
	// ordered by tokens (a schedule with more than one register writes
	// each with the tokens of one slot or election).
	byKey := map[string][]ackedWrite{}
	var keys []string
	for _, w := range acked {
		if _, ok := byKey[w.key]; !ok {
			keys = append(keys, w.key)
		}
		byKey[w.key] = append(byKey[w.key], w)
	}
	slices.Sort(keys)
	owner := map[hlc.Timestamp]string{}
	for _, k := range keys {
		on := ""
		if k != register {
			on = fmt.Sprintf(" (register %q)", k)
		}
		ws := byKey[k]
		var prev *ackedWrite // the last write compared
		for i, w := range ws {
			if o, ok := owner[w.token]; ok && o != w.who {
				v = append(v, fmt.Sprintf("token %v used by %s and %s", w.token, o, w.who))
			}
			owner[w.token] = w.who
			if w.paused && w.token.Node != w.version.Node && order(w.token, w.version) < 0 {
				continue // fenced by a lost store only
			}
			if prev != nil && order(w.token, prev.token) < 0 {
				v = append(v, fmt.Sprintf("terms interleave%s: write at %v by %s with token %v (paused %v) accepted after write at %v by %s with token %v",
					on, w.version, w.who, w.token, w.paused, prev.version, prev.who, prev.token))
			}
			prev = &ws[i]
		}
	}
	return v
}

// overlaps returns how many terms began before the previous term (by start)
// had seen its end, and the longest such overlap, leaving out terms whose
// work was paused (a paused process cannot see its term end: that is what
// fencing is for). Leadership is decided on each candidate's own clock, so
// this depends on scheduling as well as on the library: it is reported, not
// a violation. Fencing is what keeps the register safe either way.
func (h *history) overlaps() (n int, longest time.Duration) {
	h.mu.Lock()
	terms := slices.Clone(h.terms)
	h.mu.Unlock()
	slices.SortFunc(terms, func(a, b *termRecord) int { return cmp.Compare(a.start, b.start) })
	for i := 1; i < len(terms); i++ {
		p := terms[i-1]
		if p.paused {
			continue
		}
		if p.end == 0 || terms[i].start < p.end {
			n++
			end := p.end
			if end == 0 {
				end = h.now()
			}
			longest = max(longest, time.Duration(end-terms[i].start))
		}
	}
	return n, longest
}
