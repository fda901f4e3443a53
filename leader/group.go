package leader

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sync/errgroup"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// DefaultMaxMembers is how many members a [Group] has room for unless
// [WithMaxMembers] says otherwise.
const DefaultMaxMembers = 16

// maxMaxMembers bounds WithMaxMembers: each member watches every slot.
const maxMaxMembers = 1024

// Group spreads the leadership of many elections (one per shard, say) evenly
// over the live members of a group, and moves it when members join or
// leave. Create it with [NewGroup]; [Group.Run] runs the work of each
// election this member leads. Every member of a group must be given the
// same elections.
//
// Each election is still an election of this package: a member leads it
// only with a term ([Campaign]), so that at most one member leads an
// election at any moment, and each term's token fences its writes. The
// group only decides who campaigns: every member computes the same
// [PriorityAssignment] (with no priorities, [Assignment]) from the live
// members and the elections, and campaigns only in the elections assigned
// to it. docs/design/leader.md, "Groups: many elections", describes how.
//
// [WithPriority] gives the member a priority (default 0), for every
// election of the group: the elections are spread over the live members
// of the highest priority present, and members of a lower priority stand
// by, leading nothing, until no member of a higher priority is live
// ([PriorityAssignment]). When a member of a higher priority joins, the
// others hand their elections over to it as at any rebalance: each work's
// context ends (cause [ErrTransferred]), and once the work has returned
// the term is resigned, and the new member's campaign takes the key at
// once. Priorities are per member, not per election, because what users
// prefer is a member as a whole (the new version of a rolling upgrade,
// the node nearest the devices), not a member shard by shard; and they
// are part of the assignment, which already says who campaigns in each
// election, rather than challenges (as an [Elector]'s priorities are)
// that the assignment would undo at the next change of members. Members
// learn each other's priorities from the member slots. A member of a
// version without priorities would count a member with a priority as
// another member: give priorities only once every member has a version
// that knows them.
type Group struct {
	c          *sskv.Client
	name       string
	elections  []string // sorted
	value      []byte
	o          options // candidateID is the member id; no priority (see priority)
	id         string
	priority   int // WithPriority's, published in the slot
	ttl        time.Duration
	settle     time.Duration // how long a change of members settles before a rebalance
	maxMembers int
	log        *slog.Logger

	changed chan struct{} // capacity 1: the view of the slots changed

	mu      sync.Mutex
	runs    bool
	slots   []slotState
	self    int              // the slot this member holds; -1 when none
	leading map[string]*Term // the elections whose work runs now
}

// slotState is a member's view of one member slot.
type slotState struct {
	id       string // the member that holds it; "" when free
	priority int    // that member's priority
	ended    bool   // the watch ended: watch again
}

// NewGroup returns a Group for a member of the group named group, which
// splits the leadership of elections (the state store keys of the
// elections, as for [Campaign]) among its members, and publishes value in
// each election it leads. It sends nothing until Run.
//
// The member's id is [WithCandidateID]'s, or by default the sskv client id,
// "/" and 16 random hex digits: it must be unique among the members, as it
// is also the candidate id of the member's terms. [WithMaxMembers] sets how
// many members the group has room for (default [DefaultMaxMembers]); TTL,
// renew interval and renew deadline apply to the terms and to the member's
// slot alike; [WithPriority] sets the member's priority (see [Group]).
// Every member of a group must use the same elections, TTL and
// MaxMembers. An empty group name, no elections, an empty or repeated
// election, a negative priority, a member id that ends as a slot's
// priority does ("\x00priority=" and a number), or invalid options give
// an error wrapping [ErrConfig].
func NewGroup(c *sskv.Client, group string, elections []string, value []byte, opts ...Option) (*Group, error) {
	o := newOptions(opts)
	bad := func(format string, args ...any) error {
		return &electionError{group, "group", fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)}
	}
	switch {
	case c == nil:
		return nil, bad("nil sskv.Client")
	case group == "":
		return nil, bad("empty group name")
	case len(elections) == 0:
		return nil, bad("no elections")
	case o.maxMembers < 0 || o.maxMembers > maxMaxMembers:
		return nil, bad("MaxMembers %d out of range [1, %d]", o.maxMembers, maxMaxMembers)
	case o.priority < 0:
		return nil, bad("negative priority %d", o.priority)
	}
	sorted := slices.Clone(elections)
	slices.Sort(sorted)
	for i, e := range sorted {
		if e == "" {
			return nil, bad("empty election name")
		}
		if i > 0 && sorted[i-1] == e {
			return nil, bad("election %q given twice", e)
		}
	}
	if o.maxMembers == 0 {
		o.maxMembers = DefaultMaxMembers
	}
	if o.candidateID == "" {
		o.candidateID = c.ID() + "/" + randHex(8)
	}
	if _, p := parseSlot(o.candidateID); p != 0 {
		return nil, bad("member id %q ends as a slot's priority does", o.candidateID)
	}
	// The priority goes into the slot and the Assignment; the terms take
	// no part in an Elector's priority protocol.
	priority := o.priority
	o.priority, o.prioritySet = 0, false
	// Validate the options as a term's lock, and a slot's, would: those
	// with the longest keys, which must not be too long to watch.
	longest := slices.MaxFunc(sorted, func(a, b string) int { return len(a) - len(b) })
	l, err := lock.New(c, o.lockConfig(longest, value))
	if err != nil {
		return nil, &electionError{group, "group", err}
	}
	if _, err := lock.New(c, slotConfig(&o, priority, slotKey(group, o.maxMembers-1))); err != nil {
		return nil, &electionError{group, "group", err}
	}
	ttl := l.Config().TTL
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	g := &Group{
		c:          c,
		name:       group,
		elections:  sorted,
		value:      value,
		o:          o,
		id:         o.candidateID,
		priority:   priority,
		ttl:        ttl,
		settle:     min(max(ttl/20, 10*time.Millisecond), 100*time.Millisecond),
		maxMembers: o.maxMembers,
		log:        o.logger.With("group", group, "member", o.candidateID),
		changed:    make(chan struct{}, 1),
		self:       -1,
	}
	return g, nil
}

// slotKey is the key of member slot i of group.
func slotKey(group string, i int) string { return group + "\x00member\x00" + strconv.Itoa(i) }

// slotConfig is the configuration of the lock of a member's slot: its
// HolderID, the member id and priority p (slotValue), is the key's value.
func slotConfig(o *options, p int, key string) lock.Config {
	return lock.Config{
		Name:          key,
		HolderID:      slotValue(o.candidateID, p),
		TTL:           o.ttl,
		RenewInterval: o.renewInterval,
		RenewDeadline: o.renewDeadline,
		Race:          true, // only TryLock: no queue
		Logger:        o.logger,
	}
}

// slotPriorityInfix separates a member's id from its priority in the value
// of its slot.
const slotPriorityInfix = "\x00priority="

// slotValue is the value of the slot of member id with priority p: the id
// alone for priority 0, as members wrote before priorities, so that those
// members and these read each other's slots.
func slotValue(id string, p int) string {
	if p == 0 {
		return id
	}
	return id + slotPriorityInfix + strconv.Itoa(p)
}

// parseSlot reads the member id and priority of a slot's value (its lock
// holder's id). A value that slotValue does not write with a priority
// above 0 is an id alone, of priority 0.
func parseSlot(v string) (id string, p int) {
	i := strings.LastIndex(v, slotPriorityInfix)
	if i < 0 {
		return v, 0
	}
	num := v[i+len(slotPriorityInfix):]
	p, err := strconv.Atoi(num)
	if err != nil || p <= 0 || strconv.Itoa(p) != num {
		return v, 0
	}
	return v[:i], p
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ID returns this member's id: the candidate id of its terms, and what
// [Group.Members] and [Leaders] report.
func (g *Group) ID() string { return g.id }

// Elections returns the group's elections, sorted.
func (g *Group) Elections() []string { return slices.Clone(g.elections) }

// Members returns the ids of the group's live members as this member sees
// them (sorted): those whose slot key exists, this member included while
// it holds its slot. It is empty when Run does not run.
func (g *Group) Members() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.membersLocked()
}

func (g *Group) membersLocked() []string {
	return slices.Sorted(maps.Keys(g.prioritiesLocked()))
}

// prioritiesLocked returns the live members as this member sees them, with
// their priorities. A member seen in two slots (an old slot of its own not
// expired yet) counts once, with the higher priority.
func (g *Group) prioritiesLocked() map[string]int {
	if !g.runs {
		return nil
	}
	ps := map[string]int{}
	for i, s := range g.slots {
		if s.id != "" && (s.id != g.id || i == g.self) {
			if p, ok := ps[s.id]; !ok || s.priority > p {
				ps[s.id] = s.priority
			}
		}
	}
	if g.self >= 0 {
		ps[g.id] = g.priority
	}
	return ps
}

// Priority returns this member's priority ([WithPriority]).
func (g *Group) Priority() int { return g.priority }

// Leading returns the elections this member leads now (sorted): those
// whose work runs, with a term that has not ended.
func (g *Group) Leading() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var es []string
	for e, t := range g.leading {
		if t.Err() == nil {
			es = append(es, e)
		}
	}
	slices.Sort(es)
	return es
}

// Term returns the term of election whose work runs now on this member, or
// nil.
func (g *Group) Term(election string) *Term {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leading[election]
}

// Run joins the group and runs work for each election this member leads,
// each in a goroutine of its own, until ctx ends; it then stops every work,
// resigns every term, leaves the group and returns ctx's error.
//
// To join, Run takes the first free member slot (one of MaxMembers keys,
// each held as a [lock.Lock] with the group's TTL), and it watches every
// slot (KEYNOTIFY) to learn the live members; it sends no request while
// the members stay the same, other than the renewals of its slot and
// terms. When the members change, it computes the [PriorityAssignment] of
// the elections to the members after a short settling time (a twentieth
// of the TTL, between 10 and 100 ms), campaigns in the elections newly
// assigned to it and hands over those no longer assigned to it: their
// work's context ends (cause [ErrTransferred]), and once the work has
// returned the term is resigned, so that the new owner's campaign, waiting
// on the election's key, takes it at once. The campaigns a rebalance
// starts are paced (at most 64 start within 50 ms of each other), so that
// they do not hold up the member's renewals on the same connection. If every slot is taken, Run waits for
// one to free up (and logs a warning). If this member loses its slot (its renewals failed), it joins
// again at once, on any free slot, and keeps its terms meanwhile: the
// assignment depends on the members' ids, not on their slots. If it cannot
// join again within the settling time (after a reconnect, no slot is taken
// within a TTL), it hands every election over until it has.
//
// work gets a context that ends when the term ends, when the election is
// handed over, or when ctx ends, and the term (for its token, fenced
// writers and Proclaim). When a term is lost, Run waits for its work to
// return, resigns it, and campaigns again if the election is still
// assigned to this member. work should run until its context ends: if it
// returns while its term lasts, Run stops, as [Elector.Run] does: it stops
// every other work, resigns every term, leaves the group and returns
// work's error (nil included). Run also stops, and returns the error, when
// a campaign fails (the store refused it: see [Campaign]) or the client is
// closed.
//
// Run may be called again after it returned, but not concurrently.
func (g *Group) Run(ctx context.Context, work func(ctx context.Context, t *Term) error) error {
	if work == nil {
		return &electionError{g.name, "run", fmt.Errorf("%w: nil work", ErrConfig)}
	}
	g.mu.Lock()
	if g.runs {
		g.mu.Unlock()
		return &electionError{g.name, "run", errors.New("Run is already running")}
	}
	g.runs = true
	g.slots = make([]slotState, g.maxMembers)
	g.self = -1
	g.leading = map[string]*Term{}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.runs = false
		g.slots, g.self, g.leading = nil, -1, nil
		g.mu.Unlock()
	}()
	select { // a change left over from an earlier Run
	case <-g.changed:
	default:
	}

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &groupRun{g: g, ctx: rctx, cancel: cancel, work: work, runners: map[string]*runner{}, pace: make(chan struct{}, campaignBurst)}
	return r.run(ctx)
}

// groupRun is the state of one Run.
type groupRun struct {
	g      *Group
	ctx    context.Context // Run's, also ended by a failure
	cancel context.CancelFunc
	work   func(context.Context, *Term) error

	watchers []*sskv.Watcher // by slot; nil for a watch to make again
	pace     chan struct{}   // campaigns under way, at most campaignBurst (see campaign)
	slot     *lock.Lock      // this member's slot, while held
	runners  map[string]*runner
	wg       sync.WaitGroup

	mu       sync.Mutex
	finished bool // Run must return err
	err      error
}

// runner runs the campaigns and works of one election.
type runner struct {
	cancel   context.CancelCauseFunc
	done     chan struct{} // closed when it has resigned and returned
	stopping bool          // cancelled: handed over
}

// finish makes Run stop and return err, unless an earlier finish did.
func (r *groupRun) finish(err error) {
	r.mu.Lock()
	if !r.finished {
		r.finished, r.err = true, err
	}
	r.mu.Unlock()
	r.cancel()
}

func (r *groupRun) run(parent context.Context) error {
	g := r.g
	r.watchers = make([]*sskv.Watcher, g.maxMembers)
	defer func() {
		for _, w := range r.watchers {
			if w != nil {
				w.Stop()
			}
		}
	}()
	// Watch the slots all at once: a round trip each, not one after another.
	var eg errgroup.Group
	for i := range g.maxMembers {
		eg.Go(func() error { return r.watch(i) })
	}
	if err := eg.Wait(); err != nil {
		if parent.Err() != nil {
			return parent.Err()
		}
		return &electionError{g.name, "run", err}
	}

	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = max(g.ttl/20, 10*time.Millisecond)
	retry.MaxInterval = max(g.ttl/2, retry.InitialInterval)
	retry.MaxElapsedTime = 0
	var (
		joinAt    <-chan time.Time // try to join again
		rewatchAt <-chan time.Time // watch the slots whose watch ended again
		settleAt  <-chan time.Time // rebalance
		slotDone  <-chan struct{}  // this member's slot was lost
		warned    bool
		closed    = g.c.Done()
	)
	settleTimer := func() {
		if settleAt == nil {
			settleAt = time.After(g.settle)
		}
	}
	join := func() {
		joined, full, err := r.join()
		switch {
		case err != nil:
			r.finish(err)
		case joined:
			retry.Reset()
			joinAt, warned = nil, false
			slotDone = r.slot.Done()
			settleTimer()
		case full:
			joinAt = nil // a freed slot is a change
			if !warned {
				g.log.Warn("every member slot is taken; waiting for one to free up", "max_members", g.maxMembers)
				warned = true
			}
		default:
			joinAt = time.After(retry.NextBackOff())
		}
	}
	join()
	for {
		select {
		case <-r.ctx.Done():
			return r.shutdown(parent)
		case <-closed:
			closed = nil
			r.finish(&electionError{g.name, "run", sskv.ErrClosed})
		case <-g.changed:
			if r.slot == nil && joinAt == nil {
				join()
			}
			if rewatchAt == nil && r.watchEnded() {
				rewatchAt = time.After(retry.NextBackOff())
			}
			settleTimer()
		case <-joinAt:
			joinAt = nil
			if r.slot == nil {
				join()
			}
		case <-rewatchAt:
			rewatchAt = nil
			for i, w := range r.watchers {
				if w == nil || g.slotEnded(i) {
					if w != nil {
						w.Stop()
						r.watchers[i] = nil
					}
					if err := r.watch(i); err != nil {
						if errors.Is(err, sskv.ErrClosed) {
							r.finish(&electionError{g.name, "run", err})
						}
						rewatchAt = time.After(retry.NextBackOff())
						break
					}
				}
			}
		case <-slotDone:
			// The terms do not depend on the slot: they go on while this
			// member joins again. The assignment depends on the members'
			// ids, not their slots, so a member that is back within the
			// settling time keeps its elections; one that is not hands
			// them over.
			g.log.Warn("lost this member's slot; joining again", "error", r.slot.Err())
			old := r.slot
			r.wg.Go(func() { // deletes the key if it is still this member's
				cctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), g.ttl)
				_ = old.Close(cctx)
				cancel()
			})
			r.slot, slotDone = nil, nil
			g.mu.Lock()
			g.self = -1
			g.mu.Unlock()
			join()
			settleTimer()
		case <-settleAt:
			settleAt = nil
			r.rebalance()
		}
	}
}

// watch watches slot i. Its first event, the slot's state, is applied
// to the view as every later one is (slotEvent).
func (r *groupRun) watch(i int) error {
	g := r.g
	key := slotKey(g.name, i)
	g.mu.Lock()
	g.slots[i].ended = false
	g.mu.Unlock()
	w, err := g.c.Watch(r.ctx, key, sskv.WithCallback(func(ev sskv.Event) { g.slotEvent(i, ev) }, func(err error) {
		if err != nil && r.ctx.Err() == nil {
			g.mu.Lock()
			if g.slots != nil {
				g.slots[i].ended = true
			}
			g.mu.Unlock()
			g.poke()
		}
	}))
	if err != nil {
		return err
	}
	r.watchers[i] = w
	g.poke()
	return nil
}

func (r *groupRun) watchEnded() bool {
	for i := range r.watchers {
		if r.watchers[i] == nil || r.g.slotEnded(i) {
			return true
		}
	}
	return false
}

func (g *Group) slotEnded(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.slots[i].ended
}

// slotEvent applies an event of slot i's watch to the view: the slot's
// state when the watch started, then its changes in order, none twice,
// with what the watch missed (a reconnect, a store restart whose versions
// may go back) reported as a Resync event.
func (g *Group) slotEvent(i int, ev sskv.Event) {
	g.mu.Lock()
	if g.slots == nil {
		g.mu.Unlock()
		return
	}
	s := &g.slots[i]
	old, oldP := s.id, s.priority
	if ev.Op == sskv.OpDelete {
		s.id, s.priority = "", 0
	} else {
		s.id, s.priority = parseSlot(lock.ParseHolder(ev.Value, ev.Version).ID)
	}
	changed := old != s.id || oldP != s.priority
	g.mu.Unlock()
	if changed {
		g.poke()
	}
}

func (g *Group) poke() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// join tries to take a free slot: full reports that the view has none.
func (r *groupRun) join() (joined, full bool, err error) {
	g := r.g
	g.mu.Lock()
	var free []int
	for i, s := range g.slots {
		if s.id == "" {
			free = append(free, i)
		}
	}
	g.mu.Unlock()
	if len(free) == 0 {
		return false, true, nil
	}
	for _, i := range free {
		l, err := lock.New(g.c, slotConfig(&g.o, g.priority, slotKey(g.name, i)))
		if err != nil {
			return false, false, &electionError{g.name, "join", err}
		}
		ok, err := l.TryLock(r.ctx)
		if ok {
			r.slot = l
			g.mu.Lock()
			g.self = i
			g.mu.Unlock()
			g.log.Info("joined", "slot", i)
			return true, false, nil
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), g.ttl)
		_ = l.Close(cctx) // gives back a key taken with an unknown outcome
		cancel()
		var se *sskv.ServiceError
		switch {
		case errors.As(err, &se), errors.Is(err, sskv.ErrClosed):
			return false, false, &electionError{g.name, "join", err}
		case err != nil:
			return false, false, nil // try again later
		}
	}
	return false, false, nil
}

// errHandedOver is the cause of the work context of a term whose election
// the Assignment no longer gives this member.
var errHandedOver = fmt.Errorf("%w: the group's assignment gives the election to another member", ErrTransferred)

// rebalance starts the runners of the elections assigned to this member,
// and hands over the others.
func (r *groupRun) rebalance() {
	g := r.g
	g.mu.Lock()
	members := g.prioritiesLocked()
	joined := g.self >= 0
	g.mu.Unlock()
	mine := map[string]bool{}
	if joined && r.ctx.Err() == nil {
		for e, m := range PriorityAssignment(members, g.elections) {
			if m == g.id {
				mine[e] = true
			}
		}
	}
	started, stopped := 0, 0
	for e, n := range r.runners {
		select {
		case <-n.done:
			if n.stopping || !mine[e] {
				delete(r.runners, e)
				continue
			}
		default:
		}
		if !mine[e] && !n.stopping {
			n.stopping = true
			n.cancel(errHandedOver)
			stopped++
		}
	}
	for _, e := range g.elections {
		if !mine[e] {
			continue
		}
		old := r.runners[e]
		var prev chan struct{}
		if old != nil {
			if !old.stopping {
				continue
			}
			prev = old.done // its resign comes first
		}
		ctx, cancel := context.WithCancelCause(r.ctx)
		n := &runner{cancel: cancel, done: make(chan struct{})}
		r.runners[e] = n
		started++
		r.wg.Go(func() {
			defer close(n.done)
			defer cancel(nil)
			if prev != nil {
				<-prev
			}
			r.runElection(ctx, e)
		})
	}
	g.log.Debug("rebalanced", "members", len(members), "assigned", len(mine), "started", started, "handed_over", stopped)
}

// runElection campaigns in election and runs the work of each term until
// ctx ends (the election is handed over, or Run stops).
func (r *groupRun) runElection(ctx context.Context, election string) {
	g := r.g
	for ctx.Err() == nil {
		t, err := r.campaign(ctx, election)
		if err != nil {
			if ctx.Err() == nil {
				r.finish(err)
			}
			return
		}
		g.mu.Lock()
		g.leading[election] = t
		g.mu.Unlock()

		wctx, cancel := context.WithCancelCause(t.Context())
		stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
		werr := r.work(wctx, t)
		stop()
		cancel(nil)
		lost := t.Err()

		// The work has returned: the key may go.
		g.mu.Lock()
		delete(g.leading, election)
		g.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), g.ttl)
		if err := t.Resign(rctx); err != nil {
			g.log.Warn("could not resign; the term's key expires after the TTL", "election", election, "error", err)
		}
		rcancel()
		switch {
		case ctx.Err() != nil:
			return
		case lost != nil:
			g.log.Info("leadership lost; campaigning again", "election", election, "reason", lost)
		default:
			r.finish(werr)
			return
		}
	}
}

// Campaigns a member starts at once (a rebalance may start hundreds) are
// paced, so that their requests do not hold up the renewals of the
// member's slot and terms on the same connection: at most campaignBurst
// start within campaignHold of each other, unless the earlier ones have
// returned (won, or given up) sooner.
const (
	campaignBurst = 64
	campaignHold  = 50 * time.Millisecond
)

// campaign is Campaign in election, paced (see campaignBurst).
func (r *groupRun) campaign(ctx context.Context, election string) (*Term, error) {
	select {
	case r.pace <- struct{}{}:
	case <-ctx.Done():
		return nil, &electionError{election, "campaign", ctx.Err()}
	}
	release := sync.OnceFunc(func() { <-r.pace })
	timer := time.AfterFunc(campaignHold, release) // it waits for a leader to go: let others start
	t, err := campaign(ctx, r.g.c, election, r.g.value, &r.g.o)
	timer.Stop()
	release()
	return t, err
}

// shutdown leaves the group: it gives up the slot, so that the others
// start campaigning, stops every work, and waits for the terms to be
// resigned.
func (r *groupRun) shutdown(parent context.Context) error {
	g := r.g
	if r.slot != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(parent), g.ttl)
		if err := r.slot.Close(uctx); err != nil && !errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, lock.ErrClosed) {
			g.log.Warn("could not give up the slot; it expires after the TTL", "error", err)
		}
		cancel()
		r.slot = nil
	}
	g.mu.Lock()
	g.self = -1
	g.mu.Unlock()
	for _, n := range r.runners {
		n.cancel(nil) // Run's context has ended: its cause comes first
	}
	r.wg.Wait()
	g.log.Info("left")
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finished {
		return r.err
	}
	return parent.Err()
}

// Assignment returns the member each election is assigned to: what every
// member of a [Group] computes from the live members and the elections,
// and the same for the same sets whatever their order. It is exactly
// balanced (each member gets ⌊E/M⌋ or ⌈E/M⌉ of the E elections) and
// stable: when a member joins or leaves, few elections change hands, about
// E/M plus a few. Each election is ranked over the members by rendezvous
// (highest random weight) hashing; the elections, taken in an order given
// by a hash of their names, each go to the highest-ranked member that has
// room left. Members and elections given twice count once. It returns nil
// when there are no members.
func Assignment(members, elections []string) map[string]string {
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	es := slices.Clone(elections)
	slices.Sort(es)
	es = slices.Compact(es)
	if len(ms) == 0 {
		return nil
	}
	type keyed struct {
		name string
		h    uint64
	}
	order := make([]keyed, len(es))
	for i, e := range es {
		order[i] = keyed{e, hash64("", e)}
	}
	slices.SortFunc(order, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(a.h, b.h), cmp.Compare(a.name, b.name))
	})
	floor, extra := len(es)/len(ms), len(es)%len(ms) // extra members get floor+1
	count := make([]int, len(ms))
	rank := make([]keyed, len(ms))
	idx := make(map[string]int, len(ms))
	for i, m := range ms {
		idx[m] = i
	}
	out := make(map[string]string, len(es))
	for _, e := range order {
		for i, m := range ms {
			rank[i] = keyed{m, hash64(m, e.name)}
		}
		slices.SortFunc(rank, func(a, b keyed) int {
			return cmp.Or(cmp.Compare(b.h, a.h), cmp.Compare(a.name, b.name))
		})
		for _, m := range rank {
			i := idx[m.name]
			if count[i] < floor || (count[i] == floor && extra > 0) {
				if count[i] == floor {
					extra--
				}
				count[i]++
				out[e.name] = m.name
				break
			}
		}
	}
	return out
}

// PriorityAssignment returns the member each election is assigned to when
// members have priorities (each member's id and its priority, as given by
// [WithPriority]): what every member of a [Group] computes. The elections
// go to the members of the highest priority present, as [Assignment]
// spreads them over those members alone; members of a lower priority get
// none, whatever their number. So with every priority the same (0 by
// default) it is Assignment of the members' ids. It returns nil when there
// are no members.
func PriorityAssignment(members map[string]int, elections []string) map[string]string {
	if len(members) == 0 {
		return nil
	}
	top := slices.Max(slices.Collect(maps.Values(members)))
	var ms []string
	for m, p := range members {
		if p == top {
			ms = append(ms, m)
		}
	}
	return Assignment(ms, elections)
}

// hash64 is the rendezvous weight of member for election (member "" for
// the order of the elections): FNV-1a, then a 64-bit finalizer (of
// splitmix64) to spread it.
func hash64(member, election string) uint64 {
	h := fnv.New64a()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(member)))
	_, _ = h.Write(n[:])
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte(election))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Leaders returns who leads each of elections now, as [Leader] reports it
// (one GET each, a few at a time, with Leader's caveat about late writes
// of ended terms): for observers of a [Group], whose members lead with
// their member id as [State.ID]. An election nobody leads has a State
// without a leader. The error is the first GET's that failed.
func Leaders(ctx context.Context, c *sskv.Client, elections []string) (map[string]State, error) {
	if c == nil {
		return nil, fmt.Errorf("leader: leaders: %w: nil sskv.Client", ErrConfig)
	}
	if slices.Contains(elections, "") {
		return nil, fmt.Errorf("leader: leaders: %w: empty election name", ErrConfig)
	}
	var (
		mu  sync.Mutex
		out = make(map[string]State, len(elections))
	)
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(16)
	for _, e := range elections {
		eg.Go(func() error {
			s, err := Leader(ectx, c, e)
			if err != nil {
				return err
			}
			mu.Lock()
			out[e] = s
			mu.Unlock()
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}
