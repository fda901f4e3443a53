package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/sskv"
)

// result is the -json output: one object, these fields exactly.
type result struct {
	HandoverMS    float64 `json:"handover_ms"`
	TakeoverMS    float64 `json:"takeover_ms"`
	TTLMS         int64   `json:"ttl_ms"`
	Accepted      int     `json:"accepted"`
	RejectedStale int     `json:"rejected_stale"`
	Counter       int64   `json:"counter"`
	OK            bool    `json:"ok"`
}

// result returns the run's result; ok says whether every check passed.
func (r *report) result(ok bool) result {
	accepted, rejected := r.counts()
	return result{
		HandoverMS:    millis(r.handover.to - r.handover.from),
		TakeoverMS:    millis(r.takeover.to - r.takeover.from),
		TTLMS:         r.ttl.Milliseconds(),
		Accepted:      accepted,
		RejectedStale: rejected,
		Counter:       r.counter,
		OK:            ok,
	}
}

// millis is d in milliseconds, to 0.1 ms.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(100*time.Microsecond)) / 10
}

// counts returns the numbers of writes accepted and refused as stale.
func (r *report) counts() (accepted, rejected int) {
	for _, w := range r.writes {
		switch {
		case w.ok:
			accepted++
		case w.stale:
			rejected++
		}
	}
	return accepted, rejected
}

// checked is the outcome of one of the demo's checks.
type checked struct {
	name   string
	ok     bool
	detail string // why it failed
}

// check checks what the packages promise on the run.
func (r *report) check() []checked {
	var out []checked
	add := func(name string, ok bool, format string, args ...any) {
		out = append(out, checked{name, ok, fmt.Sprintf(format, args...)})
	}

	accepted, _ := r.counts()
	add("the counter equals the accepted writes: none lost, doubled, or let through stale",
		r.counter == int64(accepted), "the counter is %d, but %d writes were accepted", r.counter, accepted)

	// A candidate leads from its Campaign returning until it stopped
	// leading: it resigned or crashed after its work returned, or its term
	// ended and its work returned.
	terms := slices.SortedFunc(slices.Values(r.terms), func(a, b *term) int { return cmp.Compare(a.elected, b.elected) })
	overlap := ""
	for i, t := range terms {
		switch {
		case t.end < t.elected:
			overlap = fmt.Sprintf("%s's term %d has no end", t.c.name, t.n)
		case i > 0 && t.elected <= terms[i-1].end:
			p := terms[i-1]
			overlap = fmt.Sprintf("%s was elected at %.4fs, while %s led until %.4fs", t.c.name, t.elected.Seconds(), p.c.name, p.end.Seconds())
		}
		if overlap != "" {
			break
		}
	}
	add(fmt.Sprintf("never two leaders at once (%d terms)", len(terms)), overlap == "" && len(terms) == 4, "%s", cmp.Or(overlap, "not every term ran"))

	add("the stale writes were rejected: by the fenced writer, and by the store",
		errors.Is(r.staleWriter, fenced.ErrStale) && errors.Is(r.staleStore, sskv.ErrFencingTokenLower),
		"fenced writer: %v; store: %v", r.staleWriter, r.staleStore)

	p := r.pause
	add("the frozen leader's term ended on its own clock before its lease could expire",
		p.lost > 0 && p.lost < p.lastRenewal+r.ttl && p.lost < p.next,
		"it ended at %.4fs, %v after its last renewal (TTL %v); the next leader was elected at %.4fs",
		p.lost.Seconds(), p.lost-p.lastRenewal, r.ttl, p.next.Seconds())

	increasing := ""
	for i := 1; i < len(r.terms); i++ {
		a, b := r.terms[i-1].t.Token(), r.terms[i].t.Token()
		if !b.After(a) {
			increasing = fmt.Sprintf("term %d's token %s is not after term %d's %s", i+1, b, i, a)
			break
		}
	}
	add("fencing tokens increase strictly from term to term", increasing == "", "%s", increasing)
	return out
}

// failures returns the details of the failed checks.
func failures(cs []checked) []string {
	var out []string
	for _, c := range cs {
		if !c.ok {
			out = append(out, c.name+": "+c.detail)
		}
	}
	return out
}

// summary prints the results and the checks under the timeline.
func (r *report) summary(w io.Writer, cs []checked) {
	accepted, rejected := r.counts()
	per := map[string]int{}
	for _, wr := range r.writes {
		if wr.ok {
			per[r.names[wr.lane]]++
		}
	}
	var by []string
	for _, n := range r.names {
		by = append(by, fmt.Sprintf("%s %d", n, per[n]))
	}
	fmt.Fprintf(w, "\nsummary\n")
	fmt.Fprintf(w, "  handover  %-8s from the start of Resign to the next leader's Campaign returning\n", fmtDur(r.handover.to-r.handover.from))
	fmt.Fprintf(w, "  takeover  %-8s from the crashed leader's last renewal to the next election (TTL %v)\n", fmtDur(r.takeover.to-r.takeover.from), r.ttl)
	fmt.Fprintf(w, "  writes    %d accepted (%s), %d rejected as stale", accepted, strings.Join(by, ", "), rejected)
	if r.unknown > 0 {
		fmt.Fprintf(w, ", %d with an unknown outcome", r.unknown)
	}
	fmt.Fprintf(w, "\n  counter   %d in the store\n", r.counter)
	fmt.Fprintf(w, "checks\n")
	for _, c := range cs {
		mark := "ok    "
		if !c.ok {
			mark = "FAILED"
		}
		fmt.Fprintf(w, "  %s %s\n", mark, c.name)
		if !c.ok {
			fmt.Fprintf(w, "         %s\n", c.detail)
		}
	}
	if len(failures(cs)) == 0 {
		fmt.Fprintf(w, "all checks passed; the demo took %.1fs\n", r.end.Seconds())
	}
}
