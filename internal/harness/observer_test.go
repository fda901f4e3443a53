package harness_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
)

// observations are the election's states as an observer (leader.Observe)
// got them. A term token must never go backwards: each new leader's token
// must be above every token seen before it (in store order, see
// history.storeOrder). A token that is not is a step back, and it is a
// violation if its term still leads when it can no longer be excused:
//
//   - a term older than the newest one seen must have ended by the renew
//     deadline after that newer term was first seen: it cannot have renewed
//     since the newer term took the key;
//   - the newest term, seen again after its key was seen deleted (by hand, by
//     a restart) or taken, must have ended by the renew deadline after that.
//
// A term that goes on past that point renewed a key that had been deleted
// or taken: it re-created it, and carries on with an older token than a term
// that came between. A step back whose term had ended by then is a key
// re-created by a late request (a renewal held in the network): the library
// documents it (the key expires after one TTL), so it is counted, not a
// violation.
type observations struct {
	mu       sync.Mutex
	n        int                     // states got
	last     leader.State            // the last state got
	newest   hlc.Timestamp           // the newest token seen
	seen     map[hlc.Timestamp]int64 // when each token was first seen
	gone     map[hlc.Timestamp]int64 // when each token was last seen replaced
	steps    []*stepBack
	checking sync.WaitGroup // step backs whose term is not yet checked
}

// stepBack is a state whose token was not above every token seen before it.
type stepBack struct {
	at     int64         // when the observer got it
	st     leader.State  // what it got
	newest hlc.Timestamp // the newest token seen before
	live   bool          // its term still led when checked
	check  int64         // when it was checked
}

// lossGrace is how long after the reference time of a step back its term
// must have ended: the renew deadline, and a little for the term to act on
// the news of its loss once it arrives (a watch event, a refused renewal).
const lossGrace = renewDeadline + 100*time.Millisecond

// observed records a state the observer got, and checks a step back's term
// once lossGrace has passed since its reference time.
func (h *history) observed(st leader.State) {
	order := h.storeOrder()
	o := &h.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	now := h.now()
	o.n++
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
	if !prev.Token.IsZero() {
		o.gone[prev.Token] = now
	}
	if !st.HasLeader() {
		return
	}
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
	b := &stepBack{at: now, st: st, newest: o.newest}
	o.steps = append(o.steps, b)
	h.annotate(candidates, now, 0, fmt.Sprintf("observer: %s leads with token %v, after token %v", st.ID, st.Token, o.newest))
	o.checking.Add(1)
	time.AfterFunc(time.Duration(max(ref+int64(h.lossGrace)-now, 0)), func() {
		defer o.checking.Done()
		live := h.termLive(st.Token)
		o.mu.Lock()
		defer o.mu.Unlock()
		b.live, b.check = live, h.now()
	})
}

// checkObserver returns the violations of the observer's token order, and
// the step backs of terms that had ended (keys re-created by late requests).
// It waits for the checks still due.
func (h *history) checkObserver() (v []string, late []string) {
	o := &h.obs
	o.checking.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.steps {
		what := fmt.Sprintf("the observer saw %s lead with token %v at %v, after token %v", b.st.ID, b.st.Token,
			time.Duration(b.at).Round(time.Millisecond), b.newest)
		if b.live {
			v = append(v, fmt.Sprintf("term token went back: %s, and that term still led at %v", what,
				time.Duration(b.check).Round(time.Millisecond)))
		} else {
			late = append(late, what)
		}
	}
	return v, late
}

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
