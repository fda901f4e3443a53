package harness_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// A group schedule: members, each on its own client behind its own proxy,
// split groupSize elections with a leader.Group, under the same faults as
// the election schedules. Each term's work read-modify-writes its
// election's register, fenced with the term's token, until the term ends or
// is handed over. The checks:
//
//   - the registers' history is linearizable, and each register's accepted
//     writes carry non-decreasing tokens;
//   - one work per election at any moment, judged on the terms' windows:
//     when the library said each term led, with a write the store accepted
//     (see holding and history.checkHoldings);
//   - a term that led when the store was closed ends within the renew
//     deadline (history.storeLost);
//   - after the faults are healed, every member sees every member within
//     livenessLimit (joining takes a free slot: no queue to wait in), and
//     every election's work writes again within queuedLimit (a campaign
//     waits in its election's queue: see semaphore_test.go);
//   - once the members are stable (no fault since the healing), every
//     member's share is within one of the others': the election keys, read
//     from the store, are each held, and the counts of the members' terms
//     differ by at most one, within rebalanceLimit of the healing (over
//     livenessLimit is reported), and still after settle;
//   - every member's Run returns soon after the schedule ends.
const (
	members   = 3
	groupSize = 6
	groupName = "harness/group"
	// rebalanceLimit is how soon after the faults are healed the shares
	// must be even: a member that lost its slot joins again, the members'
	// views settle, and the elections handed over are won by their new
	// owners, each within a TTL or so, unless a message of a campaign's
	// queue was lost (see queuedLimit).
	rebalanceLimit = queuedLimit
	groupPace      = 3 * opPace // a term's pause between read-modify-writes
)

// groupElections are the group's elections.
func groupElections() []string {
	var es []string
	for i := range groupSize {
		es = append(es, fmt.Sprintf("harness/group/e%d", i))
	}
	return es
}

// electionRegister is the register the work of a term of election writes.
func electionRegister(election string) string { return election + "/register" }

func (s *schedule) runGroup(ctx context.Context, observer *sskv.Client, res result) (result, porcupine.LinearizationInfo, string, bool) {
	violate := func(format string, args ...any) {
		res.violations = append(res.violations, fmt.Sprintf(format, args...))
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	elections := groupElections()
	groups := map[string]*leader.Group{}
	for _, cd := range s.cand {
		g, err := leader.NewGroup(cd.c, groupName, elections, []byte(cd.id), leader.WithCandidateID(cd.id),
			leader.WithTTL(ttl), leader.WithRenewInterval(renewInterval), leader.WithRenewDeadline(renewDeadline),
			leader.WithMaxMembers(2*members), leader.WithLogger(s.logger.With("member", cd.id)))
		if err != nil {
			s.t.Fatalf("NewGroup: %v", err)
		}
		groups[cd.id] = g
		cd.runs.Go(func() { s.member(runCtx, cd, g) })
	}
	var registers []string
	for _, e := range elections {
		registers = append(registers, electionRegister(e))
	}
	var observing sync.WaitGroup
	observing.Go(func() { s.observeKeys(runCtx, observer, registers) })

	res.kinds = s.injectFaults(runCtx)
	for _, n := range res.kinds {
		res.faults += n
	}
	res.violations = append(res.violations, s.failures...)
	healed, healedAt := s.h.now(), time.Now()

	// Every member joins again, at once: taking a free member slot waits
	// for no queue, only for the hold-off after a reconnect (a TTL).
	allJoined := func() bool {
		for _, cd := range s.cand {
			if len(groups[cd.id].Members()) != members {
				return false
			}
		}
		return true
	}
	joined, stalled := s.waitUntil(runCtx, healedAt, livenessLimit, pollPace, allJoined)
	if !joined {
		violate("the members did not all see each other within %v after the faults were healed, and the %v the test process stood still meanwhile; %s",
			livenessLimit, stalled.Round(time.Millisecond), s.shares(ctx, groups).String())
		s.dumpGoroutines()
	}

	// Every election's work writes again.
	allWrote := func() bool {
		for _, e := range elections {
			if !s.h.confirmedSince("", e, healed) {
				return false
			}
		}
		return true
	}
	ok, stalled := s.waitUntil(runCtx, healedAt, queuedLimit, 0, allWrote)
	if !ok {
		var missing []string
		for _, e := range elections {
			if !s.h.confirmedSince("", e, healed) {
				missing = append(missing, e)
			}
		}
		violate("no work of %s wrote within %v after the faults were healed (a lost message's recheck and a few handovers), and the %v the test process stood still meanwhile; %s",
			strings.Join(missing, ", "), queuedLimit, stalled.Round(time.Millisecond), s.shares(ctx, groups).String())
		s.dumpGoroutines()
	}
	recovered := time.Duration(s.h.now() - healed)

	// The shares even out, and stay even.
	var sh shares
	balanced := func() bool {
		sh = s.shares(ctx, groups)
		return sh.even()
	}
	even, stalled := s.waitUntil(runCtx, healedAt, livenessLimit, pollPace, balanced)
	if !even {
		// Where the campaigns wait, for the report, then the rest of the
		// time a lost message may cost.
		s.logger.Info("harness: the shares were not even within livenessLimit after the healing", "harness", s.seed, "shares", sh.String())
		s.dumpGoroutines()
		even, stalled = s.waitUntil(runCtx, healedAt, rebalanceLimit, pollPace, balanced)
	}
	rebalanced, evenAt := time.Duration(s.h.now()-healed), time.Now()
	if even && rebalanced > livenessLimit+stalled {
		res.slowQueue = 1
		s.t.Logf("not a violation: the shares were even only %v after the faults were healed (within the %v a lost message may cost, but over %v)",
			rebalanced.Round(time.Millisecond), rebalanceLimit, livenessLimit)
	}
	if !even {
		violate("the members' shares were not within one of each other %v after the faults were healed, and the %v the test process stood still meanwhile: %s",
			rebalanceLimit, stalled.Round(time.Millisecond), sh.String())
	}
	s.sleep(runCtx, settle)
	if even && !balanced() {
		// A process that stands still misses its renewals, and its
		// terms and slot are lost as they should be: the shares must
		// then even out again, as after a fault.
		now := time.Now()
		if stalled := s.stalls.within(evenAt, now); stalled == 0 {
			violate("the members' shares were even %v after the faults were healed, and no longer %v later, with no fault: %s",
				rebalanced.Round(time.Millisecond), settle, sh.String())
		} else if again, _ := s.waitUntil(runCtx, now, rebalanceLimit, pollPace, balanced); !again {
			violate("the members' shares were even %v after the faults were healed, and no longer %v later, after the test process stood still for %v; and not again within %v: %s",
				rebalanced.Round(time.Millisecond), settle, stalled.Round(time.Millisecond), rebalanceLimit, sh.String())
		} else {
			s.logger.Info("harness: the shares were even again after the test process stood still", "harness", s.seed, "for", stalled)
		}
	}
	s.logger.Info("harness: shares at the end", "harness", s.seed, "shares", sh.String())

	stop()
	slow, stopped := s.stopWorks("Group.Run", &res)
	observing.Wait()
	res.violations = append(res.violations, s.finalReads(ctx, observer, registers)...)
	res, info, summary, slow := s.checkKind(res, 0, "", recovered, stopped, slow)
	summary += fmt.Sprintf("; shares even %v after healing (%s)", rebalanced.Round(time.Millisecond), sh.counts())
	return res, info, summary, slow
}

// member runs the member's Group until ctx ends. Run returns early on a
// refused campaign or a work's error; the member then runs it again after
// a pause, as a user would.
func (s *schedule) member(ctx context.Context, cd *candidate, g *leader.Group) {
	for ctx.Err() == nil {
		err := g.Run(ctx, func(ctx context.Context, t *leader.Term) error {
			s.termWork(ctx, cd, t)
			return nil
		})
		if err != nil && ctx.Err() == nil {
			s.t.Logf("%s: Group.Run: %v; running it again", cd.id, err)
			s.sleep(ctx, ttl)
		}
	}
}

// termWork is the work of a term of one of the group's elections:
// read-modify-write its register, fenced, until ctx ends (the term ended,
// the election was handed over, or the schedule ends).
func (s *schedule) termWork(ctx context.Context, cd *candidate, t *leader.Term) {
	tok := t.Token()
	hd := s.h.holdingStarted(cd.lane, cd.id, t.Election(), tok, func() bool {
		_, err := t.FencingToken()
		return err == nil
	})
	defer s.h.holdingEnded(hd)
	cd.works.Add(1)
	defer cd.works.Add(-1)
	s.holdWork(ctx, cd, hd, electionRegister(t.Election()), t, fenced.New(cd.c, t), 0, groupPace)
	// A paused work that found its term ended returns early: the term's
	// context ends soon after; Run must not take it for a work that quit.
	<-ctx.Done()
}

// shares is who holds each of the group's elections, read from the
// store, and each member's view.
type shares struct {
	holder map[string]string // by election: the holder's id, "" if none, or the error
	views  []string          // each member's Members and Leading
	ids    []string          // the members' ids
}

// shares reads the election keys.
func (s *schedule) shares(ctx context.Context, groups map[string]*leader.Group) shares {
	sh := shares{holder: map[string]string{}}
	for _, e := range groupElections() {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		g, err := s.admin.Get(rctx, e)
		cancel()
		switch {
		case err != nil:
			sh.holder[e] = "unread: " + err.Error()
		case g.Found:
			sh.holder[e] = lock.ParseHolder(g.Value, g.Version).ID
		default:
			sh.holder[e] = ""
		}
	}
	for _, cd := range s.cand {
		sh.ids = append(sh.ids, cd.id)
		g := groups[cd.id]
		sh.views = append(sh.views, fmt.Sprintf("%s sees members %v and leads %v", cd.id, g.Members(), g.Leading()))
	}
	return sh
}

// count returns how many elections each member holds.
func (sh shares) count() map[string]int {
	n := map[string]int{}
	for _, id := range sh.ids {
		n[id] = 0
	}
	for _, h := range sh.holder {
		if _, ok := n[h]; ok {
			n[h]++
		}
	}
	return n
}

// even reports whether every election is held by a member, and the
// members' counts are within one of each other.
func (sh shares) even() bool {
	n := sh.count()
	total := 0
	var counts []int
	for _, c := range n {
		total += c
		counts = append(counts, c)
	}
	return total == groupSize && len(counts) > 0 && slices.Max(counts)-slices.Min(counts) <= 1
}

func (sh shares) counts() string {
	n := sh.count()
	var parts []string
	for _, id := range sh.ids {
		parts = append(parts, fmt.Sprintf("%s %d", id, n[id]))
	}
	return strings.Join(parts, ", ")
}

func (sh shares) String() string {
	var es []string
	for _, e := range groupElections() {
		es = append(es, fmt.Sprintf("%s: %q", e, sh.holder[e]))
	}
	return fmt.Sprintf("election keys held: %s; counts: %s; %s", strings.Join(es, ", "), sh.counts(), strings.Join(sh.views, "; "))
}
