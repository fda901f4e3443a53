//go:build unix

package proctest

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// event is one line of a candidate's event log; see the candidate's
// documentation.
type event struct {
	T       int64  `json:"t"`
	Ev      string `json:"ev"` // work_start, work_end, inc, read_error
	Token   string `json:"token"`
	ReadNs  int64  `json:"read_ns"`
	WriteNs int64  `json:"write_ns"`
	Read    int64  `json:"read"`
	Wrote   int64  `json:"wrote"`
	Version string `json:"version"`
	Outcome string `json:"outcome"` // ok, stale, unknown
	Err     string `json:"err"`
}

// span is an interval of wall-clock time, in ns.
type span struct{ from, to int64 }

func (s span) intersects(o span) bool { return s.from <= o.to && o.from <= s.to }

func (s span) length() time.Duration { return time.Duration(s.to - s.from) }

// clock formats wall-clock times relative to the start of a run.
type clock int64

func (c clock) at(ns int64) string {
	return fmt.Sprintf("%+.3fs", time.Duration(ns-int64(c)).Seconds())
}

func (c clock) span(s span) string {
	return fmt.Sprintf("%s to %s", c.at(s.from), c.at(s.to))
}

// work is the work of one term in one candidate process.
type work struct {
	cand *candidate
	span
}

// works returns c's works. One that never logged its end ended when the
// process was killed, or else when it exited.
func works(c *candidate) []work {
	var ws []work
	for _, ev := range c.log {
		switch {
		case ev.Ev == "work_start":
			ws = append(ws, work{cand: c, span: span{ev.T, 0}})
		case ev.Ev == "work_end" && len(ws) > 0:
			ws[len(ws)-1].to = ev.T
		}
	}
	if n := len(ws); n > 0 && ws[n-1].to == 0 {
		ws[n-1].to = c.exited
		if c.killed != 0 {
			ws[n-1].to = c.killed
		}
	}
	return ws
}

// overlap is a time in which the works of two candidate processes ran at
// once. It is excused if one of the two was paused at some point in it.
//
// One other overlap is not a failure, but reported on its own: the one no
// client can prevent (package lock says so). The earlier work led before a
// store restart, and the later one is the first work of a candidate process
// that started after the restarted store was listening: it connected at
// once, having seen nothing, and found the key missing, before the former
// leader had reconnected and found its key gone. (A process started while
// the store was down connects only after failed attempts, and holds off: an
// overlap with it is a failure.)
type overlap struct {
	a, b work
	span
	pausedCand *candidate // the paused one; nil if not excused
	pause      span
	restart    span // the store restart the later work's process started after; zero if none
}

func (o overlap) excused() bool { return o.pausedCand != nil }

// unknowable reports whether o is the overlap no client can prevent (see
// overlap).
func (o overlap) unknowable() bool { return !o.excused() && o.restart != (span{}) }

// findOverlaps returns every overlap of the works of cands, in time order:
// check (1). restarts are the store restarts, from the kill to the new
// store listening.
func findOverlaps(cands []*candidate, restarts []span) []overlap {
	var all []work
	for _, c := range cands {
		all = append(all, works(c)...)
	}
	slices.SortFunc(all, func(a, b work) int { return cmp.Compare(a.from, b.from) })
	var found []overlap
	for i, a := range all {
		for _, b := range all[i+1:] {
			if b.from >= a.to {
				break // and so do all later ones
			}
			if a.cand == b.cand {
				continue
			}
			o := overlap{a: a, b: b, span: span{b.from, min(a.to, b.to)}}
		excuse:
			for _, c := range []*candidate{a.cand, b.cand} {
				for _, p := range c.pauses {
					if p.intersects(o.span) {
						o.pausedCand, o.pause = c, p
						break excuse
					}
				}
			}
			if first := works(b.cand); len(first) > 0 && first[0].from == b.from {
				for _, r := range restarts {
					if a.from < r.from && r.to <= b.cand.started && b.cand.started <= o.from {
						o.restart = r
					}
				}
			}
			found = append(found, o)
		}
	}
	return found
}

// describe says what o is, for the report: for an excused overlap, whose
// pause excuses it (a pause of the earlier work's candidate explains an
// overlap; one of the later work's does not, but excuses it all the same)
// and when the overlap ended relative to the pause.
func (o overlap) describe(c clock) string {
	s := fmt.Sprintf("%s and %s worked at once from %s for %v", o.a.cand.name, o.b.cand.name,
		c.at(o.from), o.length().Round(time.Microsecond))
	if o.unknowable() {
		return s + fmt.Sprintf(": not excused by a pause, but no client can know it: %s started at %s, after the store restarted (%s), having seen nothing; %s had not reconnected yet",
			o.b.cand.name, c.at(o.b.cand.started), c.span(o.restart), o.a.cand.name)
	}
	if !o.excused() {
		return s + ": NOT EXCUSED"
	}
	which := "earlier"
	if o.pausedCand == o.b.cand {
		which = "later"
	}
	end := time.Duration(o.to - o.pause.to).Round(time.Microsecond)
	return s + fmt.Sprintf(": excused, %s (the %s work) was paused %s; the overlap ended %s",
		o.pausedCand.name, which, c.span(o.pause), relative(end))
}

// relative says when something ended relative to a pause's end (taken
// after SIGCONT was sent: a work that ends as its process wakes up ends
// just before it).
func relative(d time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("%v before the pause's end", -d)
	}
	return fmt.Sprintf("%v after the pause's end", d)
}

// increments is what check (2) found.
type increments struct {
	ok, stale, unknown, readErrors int
	ambiguous                      int // acknowledged writes that may belong to either of two store lifetimes
	violations                     []string
}

// lifetimes returns the store lifetimes (indexes into stores, in order, which
// do not overlap) in which something that happened during s may have been
// executed: lo to hi, or lo > hi if none.
func lifetimes(stores []span, s span) (lo, hi int) {
	lo, hi = len(stores), -1
	for i, st := range stores {
		if st.intersects(s) {
			lo, hi = min(lo, i), i
		}
	}
	return lo, hi
}

// applied returns when the acknowledged write of ev, at version v, was
// applied: between its sending and its answer and, within that, in the
// millisecond of v's wall clock (widened by a millisecond each way). The
// store stamps a write with its hybrid logical clock, whose wall part is
// this machine's clock, which every process of the test shares: the
// clients' timestamps, which can push it ahead, come from the same clock.
// If v is outside the span (a clock stepped back), the span is all there is.
func applied(ev event, v hlc.Timestamp) span {
	s := span{ev.WriteNs, ev.T}
	ms := int64(time.Millisecond)
	if vs := (span{(v.Wall - 1) * ms, (v.Wall + 2) * ms}); vs.intersects(s) {
		return span{max(s.from, vs.from), min(s.to, vs.to)}
	}
	return s
}

// checkIncrements checks the acknowledged increments of cands against the
// store lifetimes: check (2). A store restart loses the counter, so the
// increments are checked per lifetime. An increment's read was executed
// between its sending and the sending of its write, and its write when
// [applied] says; each is assigned to the lifetimes of the store processes
// that ran meanwhile (stores: from just before a process was started to
// when it was reaped after its exit). An acknowledged write that may belong
// to two lifetimes is ambiguous: it is counted, and left out of the
// comparisons with other writes. The checks, for acknowledged writes:
//
//   - each wrote one more than the value its increment read, and that read
//     may have been executed in the write's lifetime (not in an earlier one:
//     a counter lost by a restart must not go on from its old value);
//   - no two in one lifetime wrote the same value;
//   - in one lifetime, in the store's version order, the values increase:
//     none overwrote a larger value.
func checkIncrements(cands []*candidate, stores []span, c clock) increments {
	var res increments
	type write struct {
		cand *candidate
		ev   event
		v    hlc.Timestamp
	}
	byLifetime := make([][]write, len(stores))
	bad := func(format string, args ...any) {
		res.violations = append(res.violations, fmt.Sprintf(format, args...))
	}
	for _, cand := range cands {
		for _, ev := range cand.log {
			switch {
			case ev.Ev == "read_error":
				res.readErrors++
				continue
			case ev.Ev != "inc":
				continue
			case ev.Outcome == "stale":
				res.stale++
				continue
			case ev.Outcome == "unknown":
				res.unknown++
				continue
			case ev.Outcome != "ok":
				bad("%s: increment at %s with outcome %q", cand.name, c.at(ev.T), ev.Outcome)
				continue
			}
			res.ok++
			v, err := hlc.Parse(ev.Version)
			lo, hi := lifetimes(stores, applied(ev, v))
			_, rhi := lifetimes(stores, span{ev.ReadNs, ev.WriteNs})
			switch {
			case err != nil:
				bad("%s: write of %d at %s: version %q: %v", cand.name, ev.Wrote, c.at(ev.T), ev.Version, err)
			case ev.Wrote != ev.Read+1:
				bad("%s: wrote %d after reading %d at %s", cand.name, ev.Wrote, ev.Read, c.at(ev.T))
			case lo > hi:
				bad("%s: write of %d acknowledged at %s, sent at %s, when no store ran", cand.name, ev.Wrote, c.at(ev.T), c.at(ev.WriteNs))
			case rhi < lo:
				bad("%s: wrote %d in store lifetime %d (acknowledged at %s) on a read of %d in lifetime %d (sent at %s): the counter went on from a lost store's value",
					cand.name, ev.Wrote, lo, c.at(ev.T), ev.Read, rhi, c.at(ev.ReadNs))
			case lo != hi:
				res.ambiguous++
			default:
				byLifetime[lo] = append(byLifetime[lo], write{cand, ev, v})
			}
		}
	}
	for life, ws := range byLifetime {
		seen := make(map[int64]write)
		for _, w := range ws {
			if d, ok := seen[w.ev.Wrote]; ok {
				bad("store lifetime %d: %d written twice: by %s (acknowledged at %s, token %s) and %s (at %s, token %s): an increment was lost",
					life, w.ev.Wrote, d.cand.name, c.at(d.ev.T), d.ev.Token, w.cand.name, c.at(w.ev.T), w.ev.Token)
			}
			seen[w.ev.Wrote] = w
		}
		slices.SortFunc(ws, func(a, b write) int { return a.v.Compare(b.v) })
		for i := 1; i < len(ws); i++ {
			if p, w := ws[i-1], ws[i]; w.ev.Wrote < p.ev.Wrote {
				bad("store lifetime %d: %s wrote %d (acknowledged at %s, token %s) over %d, written before by %s (at %s, token %s): increments were lost",
					life, w.cand.name, w.ev.Wrote, c.at(w.ev.T), w.ev.Token, p.ev.Wrote, p.cand.name, c.at(p.ev.T), p.ev.Token)
			}
		}
	}
	return res
}
