//go:build unix

package proctest

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

// event is one line of a candidate's event log; see the candidate's
// documentation.
type event struct {
	T       int64  `json:"t"`
	Ev      string `json:"ev"`  // work_start, work_end, inc, read_error, acquire_error
	Res     string `json:"res"` // what the work holds: "" (the election), "slot i", a group's election
	Key     string `json:"key"` // an increment's counter key
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

// work is the work of one term (one holding of a slot) in one candidate
// process.
type work struct {
	cand *candidate
	res  string // what it holds: "" (the election), "slot i", a group's election
	span
}

// works returns c's works, in order of their start. The works of one res
// follow each other; those of different ones (a group member's elections)
// may run at once. One that never logged its end ended when the process was
// killed, or else when it exited.
func works(c *candidate) []work {
	var ws []work
	open := make(map[string]int) // res -> index in ws of its work in progress
	for _, ev := range c.log {
		switch ev.Ev {
		case "work_start":
			open[ev.Res] = len(ws)
			ws = append(ws, work{cand: c, res: ev.Res, span: span{ev.T, 0}})
		case "work_end":
			if i, ok := open[ev.Res]; ok {
				ws[i].to = ev.T
				delete(open, ev.Res)
			}
		}
	}
	for _, i := range open {
		ws[i].to = c.exited
		if c.killed != 0 {
			ws[i].to = c.killed
		}
	}
	return ws
}

// firstWork reports whether w is the first work of its process: the first
// of all if perRes is false, else the first of its res.
func firstWork(w work, perRes bool) bool {
	for _, x := range works(w.cand) {
		if !perRes || x.res == w.res {
			return x.from == w.from
		}
	}
	return false
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

// findOverlaps returns every overlap of the works of cands on one res, in
// time order: check (1). restarts are the store restarts, from the kill to
// the new store listening. A work is the first of its process, for the
// overlap no client can prevent, if it is the first of all its works or,
// with perRes (the elections of a group, each taken on its own), the first
// of its res.
func findOverlaps(cands []*candidate, restarts []span, perRes bool) []overlap {
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
			if a.cand == b.cand || a.res != b.res {
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
			o.restart = restartBefore(a, b, o.from, restarts, perRes)
			found = append(found, o)
		}
	}
	return found
}

// restartBefore returns the store restart that makes an overlap of an
// earlier work a and a later work b, from at, one no client can prevent: a
// began before the restart, and b is the first work (see findOverlaps) of a
// process started after the store listened again and before at. Zero if
// none.
func restartBefore(a, b work, at int64, restarts []span, perRes bool) span {
	var found span
	if firstWork(b, perRes) {
		for _, r := range restarts {
			if a.from < r.from && r.to <= b.cand.started && b.cand.started <= at {
				found = r
			}
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
	if o.a.res != "" {
		s = fmt.Sprintf("%s: %s", o.a.res, s)
	}
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
//     none overwrote a larger value;
//   - in one lifetime, in the store's version order, the tokens do not
//     decrease: the store accepted no write of a holding after one of a newer
//     holding (of the same election or slot), so no two holdings' writes
//     interleave.
//
// Each counter key (event.Key) is checked on its own.
func checkIncrements(cands []*candidate, stores []span, c clock) increments {
	var res increments
	type write struct {
		cand *candidate
		ev   event
		v    hlc.Timestamp
	}
	type counter struct {
		life int
		key  string
	}
	byCounter := make(map[counter][]write)
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
				k := counter{lo, ev.Key}
				byCounter[k] = append(byCounter[k], write{cand, ev, v})
			}
		}
	}
	counters := slices.SortedFunc(maps.Keys(byCounter), func(a, b counter) int {
		return cmp.Or(cmp.Compare(a.life, b.life), cmp.Compare(a.key, b.key))
	})
	for _, k := range counters {
		ws, life := byCounter[k], fmt.Sprintf("store lifetime %d", k.life)
		if k.key != "" {
			life += ", " + k.key
		}
		seen := make(map[int64]write)
		for _, w := range ws {
			if d, ok := seen[w.ev.Wrote]; ok {
				bad("%s: %d written twice: by %s (acknowledged at %s, token %s) and %s (at %s, token %s): an increment was lost",
					life, w.ev.Wrote, d.cand.name, c.at(d.ev.T), d.ev.Token, w.cand.name, c.at(w.ev.T), w.ev.Token)
			}
			seen[w.ev.Wrote] = w
		}
		slices.SortFunc(ws, func(a, b write) int { return a.v.Compare(b.v) })
		for i := 1; i < len(ws); i++ {
			p, w := ws[i-1], ws[i]
			if w.ev.Wrote < p.ev.Wrote {
				bad("%s: %s wrote %d (acknowledged at %s, token %s) over %d, written before by %s (at %s, token %s): increments were lost",
					life, w.cand.name, w.ev.Wrote, c.at(w.ev.T), w.ev.Token, p.ev.Wrote, p.cand.name, c.at(p.ev.T), p.ev.Token)
			}
			pt, perr := hlc.Parse(p.ev.Token)
			wt, werr := hlc.Parse(w.ev.Token)
			if perr == nil && werr == nil && wt.Compare(pt) < 0 {
				bad("%s: %s wrote %d with token %s (acknowledged at %s) after %s wrote %d with the newer token %s (at %s): two holdings' writes interleaved",
					life, w.cand.name, w.ev.Wrote, w.ev.Token, c.at(w.ev.T), p.cand.name, p.ev.Wrote, p.ev.Token, c.at(p.ev.T))
			}
		}
	}
	return res
}

// crowd is a time in which more than limit works ran at once (on a
// semaphore of limit slots): check (1) of the semaphore run, beside the
// overlaps of the works of each slot. Like an overlap, it is excused if,
// at every moment of it, no more than limit of the works that ran were
// never paused during the crowd; and it is the one no client can prevent
// if, at every moment, no more than limit were never paused and not the
// first work of a process started after a store restart, that another
// work of the moment began before (see overlap).
type crowd struct {
	span
	most       int    // the most works at once
	works      []work // every work that ran in it
	excused    bool
	unknowable bool
}

// findCrowds returns the crowds of the works of cands, in time order.
func findCrowds(cands []*candidate, restarts []span, limit int) []crowd {
	var all []work
	var edges []int64
	for _, c := range cands {
		for _, w := range works(c) {
			all = append(all, w)
			edges = append(edges, w.from, w.to)
		}
	}
	slices.Sort(edges)
	edges = slices.Compact(edges)
	active := func(at int64) []work {
		var ws []work
		for _, w := range all {
			if w.from <= at && at < w.to {
				ws = append(ws, w)
			}
		}
		return ws
	}
	// The crowds' spans first, then what ran in each.
	var found []crowd
	for i, at := range edges {
		n := len(active(at))
		if n <= limit {
			continue
		}
		if k := len(found) - 1; k >= 0 && found[k].to == at {
			found[k].to, found[k].most = edges[i+1], max(found[k].most, n)
		} else {
			found = append(found, crowd{span: span{at, edges[i+1]}, most: n}) // i+1 exists: a work ends after at
		}
	}
	for k := range found {
		cr := &found[k]
		cr.excused, cr.unknowable = true, true
		for _, at := range edges {
			if at < cr.from || at >= cr.to {
				continue
			}
			ws := active(at)
			var unpaused, unexplained int
			for _, w := range ws {
				if !slices.Contains(cr.works, w) {
					cr.works = append(cr.works, w)
				}
				part := span{max(w.from, cr.from), min(w.to, cr.to)}
				if slices.ContainsFunc(w.cand.pauses, part.intersects) {
					continue
				}
				unpaused++
				fresh := slices.ContainsFunc(ws, func(a work) bool {
					return a.cand != w.cand && restartBefore(a, w, at, restarts, false) != (span{})
				})
				if !fresh {
					unexplained++
				}
			}
			cr.excused = cr.excused && unpaused <= limit
			cr.unknowable = cr.unknowable && unexplained <= limit
		}
		cr.unknowable = cr.unknowable && !cr.excused
	}
	return found
}

// describe says what cr is, for the report.
func (cr crowd) describe(c clock) string {
	var names []string
	for _, w := range cr.works {
		names = append(names, fmt.Sprintf("%s (%s, %s)", w.cand.name, w.res, c.span(w.span)))
	}
	s := fmt.Sprintf("%d works at once from %s for %v: %s", cr.most, c.at(cr.from),
		cr.length().Round(time.Microsecond), strings.Join(names, ", "))
	switch {
	case cr.excused:
		return s + ": excused by pauses"
	case cr.unknowable:
		return s + ": not excused by pauses, but no client can know it (a process started just after a store restart)"
	}
	return s + ": NOT EXCUSED"
}
