package harness_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
)

// observations are the election's states as an observer (leader.Observe)
// got them. They say when terms must have stopped leading:
//
//   - A term whose key the observer saw deleted (by hand, by expiry, lost
//     with a store) or taken, or that led when the store was closed, must
//     stop leading by the renew deadline after that: every renewal it sent
//     before had a deadline sooner, and one sent after can only have
//     succeeded by re-creating the key.
//   - A term token must never go back: each new leader's token must be above
//     every token seen before it (in store order, see history.storeOrder).
//     A token that is not is a step back; its term must have stopped
//     leading by the renew deadline after the newer term was first seen (or,
//     the newest term seen again, after its key was seen gone).
//
// A term that still leads then is a violation: it renewed a key that had
// been deleted or taken, re-creating it, and carries on with an older token
// than a term that came between, or its work overlaps a newer term's for
// longer than the lease allows. A step back whose term had ended by then is
// a key re-created by a late request of that term. If a fault held back or
// slowed down the term's requests then (a renewal held in the network), the
// library documents it (the key expires after one TTL): it is counted, not a
// violation. If none did, the client re-created the key by itself, with a
// request sent again on a resumed session or sent not knowing the key was
// gone: a violation.
//
// One more case is counted, not a violation: a term whose key is deleted
// while a fault holds up its requests, and whose own renewal, held up, then
// re-creates the key, with no other term seen in between. The holder cannot
// tell that renewal from any other (the store answers a SET NEX the same
// whether it renewed or created the key, and the deletion's notification
// was held up with the renewal, or folded into the Resync of its watch after
// a reconnect), and nobody led meanwhile. The library documents it. The
// observer does not report the re-created key (leader.Observe does not
// report again a term it saw end), so the check reads the key itself when
// it finds the term still leading: it must hold that term's own record.
type observations struct {
	mu       sync.Mutex
	n        int                     // states got
	last     leader.State            // the last state got
	newest   hlc.Timestamp           // the newest token seen
	seen     map[hlc.Timestamp]int64 // when each token was first seen
	gone     map[hlc.Timestamp]int64 // when each token was last seen replaced
	back     map[hlc.Timestamp]bool  // tokens seen again after nobody led, with no other between
	lastLead hlc.Timestamp           // the last token seen leading
	states   []seenState             // every state got, in order
	checks   []*termCheck
	checking sync.WaitGroup // checks not yet made
}

// seenState is a state the observer got, and when.
type seenState struct {
	at int64
	st leader.State
}

// termCheck is a term that must have stopped leading by due.
type termCheck struct {
	token    hlc.Timestamp
	saw      string // what the observer saw, and when
	stepBack bool   // a step back, rather than a key gone
	closed   bool   // the key was lost with a closed store: no request of the term's can re-create it in the next one
	who      string // a step back's leader
	at       int64  // when a step back was seen
	due      int64
	live     bool  // the term still led when checked
	checked  int64 // when it was checked (at due, or a little after)
	// key is what the election's key held when a term found still leading
	// was checked (see history.readKey), and keyOwn whether that was the
	// term's own record.
	key    string
	keyOwn bool
}

// lossGrace is how long after its key was seen gone a term must have
// ended: the renew deadline, and a little for the term to act on the news of
// its loss once it arrives (a watch event, a refused renewal).
const lossGrace = renewDeadline + 100*time.Millisecond

// observed records a state the observer got, and schedules the checks of the
// terms it says must stop leading.
func (h *history) observed(st leader.State) {
	order := h.storeOrder()
	o := &h.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	now := h.now()
	o.n++
	o.states = append(o.states, seenState{at: now, st: st})
	if st.HasLeader() {
		h.log.Info("observed", "at", time.Duration(now), "leader", st.ID, "token", st.Token.String(), "resync", st.Resync)
	} else {
		h.log.Info("observed: no leader", "at", time.Duration(now), "resync", st.Resync)
	}
	prev := o.last
	o.last = st
	if st.Token == prev.Token {
		return // the same term (a Proclaim, a Resync), or still nobody
	}
	if prev.HasLeader() {
		o.gone[prev.Token] = now
		h.checkTerm(&termCheck{token: prev.Token, who: prev.ID, at: now, due: now + int64(h.lossGrace),
			saw: fmt.Sprintf("the observer saw the key of %s (token %v) gone at %v", prev.ID, prev.Token, ms(now))})
	}
	if !st.HasLeader() {
		return
	}
	if !prev.HasLeader() && st.Token == o.lastLead {
		o.back[st.Token] = true
	}
	o.lastLead = st.Token
	if _, ok := o.seen[st.Token]; !ok {
		o.seen[st.Token] = now
	}
	if o.newest.IsZero() || order(o.newest, st.Token) < 0 {
		o.newest = st.Token
		return
	}
	ref := o.seen[o.newest]
	if st.Token == o.newest {
		ref = o.gone[st.Token]
	}
	what := fmt.Sprintf("the observer saw %s lead with token %v at %v, after token %v", st.ID, st.Token, ms(now), o.newest)
	h.annotate(candidates, now, 0, what)
	h.checkTerm(&termCheck{token: st.Token, stepBack: true, who: st.ID, at: now, due: ref + int64(h.lossGrace), saw: what})
}

// storeLost checks that every term that leads now stops leading by
// lossGrace from now: its key was lost with a store, just closed. The
// observer may not see the key gone (it may reconnect after the key was
// re-created), but the harness knows.
func (h *history) storeLost() {
	now := h.now()
	h.mu.Lock()
	terms := slices.Clone(h.terms)
	h.mu.Unlock()
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	for _, r := range terms {
		if r.live != nil && r.live() {
			h.checkTerm(&termCheck{token: r.token, who: r.who, at: now, closed: true, due: now + int64(h.lossGrace),
				saw: fmt.Sprintf("the key of %s (token %v) was lost with the store at %v", r.who, r.token, ms(now))})
		}
	}
}

// checkTerm checks at c.due whether c's term still leads. The caller holds
// h.obs.mu.
func (h *history) checkTerm(c *termCheck) {
	o := &h.obs
	o.checks = append(o.checks, c)
	o.checking.Add(1)
	time.AfterFunc(time.Duration(max(c.due-h.now(), 0)), func() {
		defer o.checking.Done()
		live := h.termLive(c.token)
		checked := h.now()
		var key string
		var own bool
		if live && !c.stepBack && h.readKey != nil {
			// Still leading after its key was seen gone: what does the key
			// hold now? Its own record, if its own renewal re-created it.
			token, what, err := h.readKey()
			own = err == nil && token == c.token
			key = what
			if err != nil {
				key = "unread: " + err.Error()
			}
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		c.live, c.checked, c.key, c.keyOwn = live, checked, key, own
	})
}

// otherBetween reports whether the observer saw a term other than token
// lead after from and up to to. The caller holds h.obs.mu.
func (h *history) otherBetween(token hlc.Timestamp, from, to int64) bool {
	for _, s := range h.obs.states {
		if s.at > from && s.at <= to && s.st.HasLeader() && s.st.Token != token {
			return true
		}
	}
	return false
}

// checkObserver returns the violations the observer's states show, one for
// each term at most, and the step backs of terms that had ended while a
// fault held back their requests (keys re-created by late requests). It
// waits for the checks still due.
func (h *history) checkObserver() (v []string, late []string) {
	o := &h.obs
	o.checking.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	found := map[hlc.Timestamp]bool{}
	for _, c := range o.checks {
		// The key came back with this term's own record, and no other
		// term led in between: seen by the observer (back), or read by
		// the check itself (keyOwn), as Observe does not report again a
		// term it saw end.
		recreated := o.back[c.token] || (c.keyOwn && !h.otherBetween(c.token, c.at, c.checked))
		switch {
		case c.live && !c.stepBack && !c.closed && recreated && h.delayedAt(c.who, c.at) && !found[c.token]:
			found[c.token] = true
			l := c.saw + ", and its own renewal, held up in the network, re-created it with no other term between"
			if c.key != "" {
				l += fmt.Sprintf(" (at %v the key was %s)", ms(c.checked), c.key)
			}
			late = append(late, l)
		case c.live && !found[c.token]:
			found[c.token] = true
			what := "a term outlived its key"
			if c.stepBack {
				what = "term token went back"
			}
			v = append(v, fmt.Sprintf("%s: %s, and that term still led at %v%s", what, c.saw, ms(c.checked), h.judgedOn(c)))
		case !c.live && c.stepBack && h.delayedAt(c.who, c.at):
			late = append(late, c.saw+", and that term had ended: a late request, held back by a fault, re-created its key")
		case !c.live && c.stepBack && !found[c.token]:
			found[c.token] = true
			v = append(v, fmt.Sprintf("a client re-created its ended term's key by itself: %s; that term had ended, and no fault held back its requests then (a request sent again on a resumed session, or sent not knowing the key was gone)%s", c.saw, h.judgedOn(c)))
		}
	}
	return v, late
}

// evidenceWindow is how far before the event a check fired on its evidence
// reaches back.
const evidenceWindow = 2 * time.Second

// judgedOn returns, as indented lines, what the check c was judged on: the
// terms of its token, the states the observer got around it, the faults of
// its candidate, when faults held back that candidate's requests, and what
// the key held when it was checked. The caller holds h.obs.mu.
func (h *history) judgedOn(c *termCheck) string {
	var b strings.Builder
	line := func(format string, args ...any) {
		b.WriteString("\n    ")
		fmt.Fprintf(&b, format, args...)
	}
	from, to := c.at-int64(evidenceWindow), max(c.checked, c.due)
	b.WriteString("\n  judged on:")
	line("check: due at %v, made at %v; term live then: %v; key then: %s", ms(c.due), ms(c.checked), c.live, cmp.Or(c.key, "not read"))
	h.mu.Lock()
	for _, r := range h.terms {
		if r.token == c.token {
			end := "not ended"
			if r.end != 0 {
				end = fmt.Sprint(ms(r.end))
			}
			line("term of %s (token %v): work from %v to %s, paused %v", r.who, r.token, ms(r.start), end, r.paused)
		}
	}
	for _, a := range h.annotations {
		if a.Tag == "faults" && strings.Contains(a.Description, c.who) && a.Start <= to && max(a.End, a.Start) >= from {
			line("fault from %v to %v: %s", ms(a.Start), ms(max(a.End, a.Start)), a.Description)
		}
	}
	for _, d := range h.delays[c.who] {
		line("requests of %s held back or slowed from %v to %v", c.who, ms(d[0]), ms(d[1]))
	}
	h.mu.Unlock()
	for _, s := range h.obs.states {
		if s.at >= from && s.at <= to {
			if s.st.HasLeader() {
				line("observed at %v: %s leads with token %v (resync %v)", ms(s.at), s.st.ID, s.st.Token, s.st.Resync)
			} else {
				line("observed at %v: no leader (resync %v)", ms(s.at), s.st.Resync)
			}
		}
	}
	return b.String()
}

// ms formats a time of the schedule.
func ms(t int64) time.Duration { return time.Duration(t).Round(time.Millisecond) }

// observedStates returns how many states the observer got.
func (h *history) observedStates() int {
	h.obs.mu.Lock()
	defer h.obs.mu.Unlock()
	return h.obs.n
}

// termLive reports whether a term with token still leads: its candidate
// would still fence a write with it.
func (h *history) termLive(token hlc.Timestamp) bool {
	h.mu.Lock()
	var live []func() bool
	for _, r := range h.terms {
		if r.token == token && r.live != nil {
			live = append(live, r.live)
		}
	}
	h.mu.Unlock()
	for _, f := range live {
		if f() {
			return true
		}
	}
	return false
}
