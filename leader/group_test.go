package leader_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func shardNames(n int) []string {
	es := make([]string, n)
	for i := range es {
		es[i] = fmt.Sprintf("shards/%04d", i)
	}
	return es
}

// Assignment is exactly balanced, the same whatever the order of its
// inputs, and moves about E/(M+1) elections when a member joins or leaves.
func TestAssignment(t *testing.T) {
	if a := leader.Assignment(nil, shardNames(3)); a != nil {
		t.Errorf("Assignment with no members = %v", a)
	}
	for _, e := range []int{1, 7, 12, 100, 1000} {
		es := shardNames(e)
		var ms []string
		for i := range 8 {
			ms = append(ms, fmt.Sprintf("replica-%d/%08x", i, i*2654435761))
		}
		for m := 1; m < len(ms); m++ {
			a := leader.Assignment(ms[:m], es)
			checkBalanced(t, a, ms[:m], es)
			// The order of the inputs does not matter, nor do repeats.
			rev := slices.Clone(ms[:m])
			slices.Reverse(rev)
			res := append(slices.Clone(es), es[0])
			slices.Reverse(res)
			if b := leader.Assignment(append(rev, rev[0]), res); !maps.Equal(a, b) {
				t.Fatalf("E=%d M=%d: the assignment depends on the order of its inputs", e, m)
			}
			// A member joins: ms[m]. About E/(M+1) move, all to it ideally.
			joined := leader.Assignment(ms[:m+1], es)
			checkBalanced(t, joined, ms[:m+1], es)
			// The first member leaves.
			left := leader.Assignment(ms[1:m+1], es)
			ideal := float64(e) / float64(m+1)
			bound := int(ideal*1.15) + m + 1
			if n := moves(a, joined); n > bound {
				t.Errorf("E=%d M=%d: a join moves %d elections; want at most %d (ideal %.0f)", e, m, n, bound, ideal)
			}
			if n := moves(joined, left); n > bound {
				t.Errorf("E=%d M=%d: a leave moves %d elections; want at most %d (ideal %.0f)", e, m+1, n, bound, ideal)
			}
			if e == 1000 && m == 3 {
				t.Logf("E=1000: 3→4 members moves %d (ideal 250), 4→3 moves %d", moves(a, joined), moves(joined, left))
			}
		}
	}
}

func checkBalanced(t *testing.T, a map[string]string, members, elections []string) {
	t.Helper()
	if len(a) != len(elections) {
		t.Fatalf("%d of %d elections assigned", len(a), len(elections))
	}
	count := map[string]int{}
	for _, e := range elections {
		if !slices.Contains(members, a[e]) {
			t.Fatalf("election %s assigned to %q, not a member", e, a[e])
		}
		count[a[e]]++
	}
	lo, hi := len(elections)/len(members), (len(elections)+len(members)-1)/len(members)
	for _, m := range members {
		if count[m] < lo || count[m] > hi {
			t.Fatalf("E=%d M=%d: member %s has %d elections; want %d..%d", len(elections), len(members), m, count[m], lo, hi)
		}
	}
}

func moves(a, b map[string]string) int {
	n := 0
	for e, m := range a {
		if b[e] != m {
			n++
		}
	}
	return n
}

func TestGroupConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, tc := range []struct {
		name      string
		c         *sskv.Client
		group     string
		elections []string
		opts      []leader.Option
	}{
		{"nil client", nil, "g", []string{"a"}, nil},
		{"no group", c, "", []string{"a"}, nil},
		{"no elections", c, "g", nil, nil},
		{"empty election", c, "g", []string{"a", ""}, nil},
		{"repeated election", c, "g", []string{"a", "b", "a"}, nil},
		{"max members", c, "g", []string{"a"}, []leader.Option{leader.WithMaxMembers(-1)}},
		{"too many members", c, "g", []string{"a"}, []leader.Option{leader.WithMaxMembers(5000)}},
		{"ttl", c, "g", []string{"a"}, []leader.Option{leader.WithTTL(time.Second), leader.WithRenewDeadline(time.Second)}},
		{"member id", c, "g", []string{"a"}, []leader.Option{leader.WithCandidateID("a\nb")}},
	} {
		if _, err := leader.NewGroup(tc.c, tc.group, tc.elections, nil, tc.opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("%s: NewGroup = %v; want ErrConfig", tc.name, err)
		}
	}
	g, err := leader.NewGroup(c, "g", []string{"b", "a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Run(t.Context(), nil); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("Run(nil) = %v; want ErrConfig", err)
	}
	if got := g.Elections(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Elections = %v", got)
	}
	if _, err := leader.Leaders(t.Context(), c, []string{"a", ""}); !errors.Is(err, leader.ErrConfig) {
		t.Errorf("Leaders with an empty election = %v; want ErrConfig", err)
	}
}

// groupRig runs the members of a group, each on its own client, with a
// work that checks that no two works of an election run at once and that
// writes, fenced with its term, to a key of its election.
type groupRig struct {
	tb        testing.TB
	srv       *localstore.Server
	elections []string
	opts      []leader.Option
	every     time.Duration // how often a work writes
	members   []*groupMember

	active     map[string]*atomic.Int32 // works running, by election; read-only map
	writes     atomic.Int64
	handedOver atomic.Int64 // works whose context ended with ErrTransferred

	mu    sync.Mutex
	last  map[string]hlc.Timestamp // the token of the latest write, by election
	ended []*leader.Term           // terms whose work has returned
	began map[string]begun         // the latest work to start, by election
	quit  map[string]time.Time     // when the latest work to return returned, by election
}

// begun is when a member's work of an election started.
type begun struct {
	member string
	at     time.Time
}

type groupMember struct {
	name string
	c    *sskv.Client
	g    *leader.Group
	stop context.CancelFunc
	done chan struct{} // closed when Run has returned, with err
	err  error
}

func newGroupRig(tb testing.TB, elections int, every time.Duration, opts ...leader.Option) *groupRig {
	r := &groupRig{
		tb:        tb,
		srv:       startStore(tb),
		elections: shardNames(elections),
		opts:      opts,
		every:     every,
		active:    map[string]*atomic.Int32{},
		last:      map[string]hlc.Timestamp{},
		began:     map[string]begun{},
		quit:      map[string]time.Time{},
	}
	for _, e := range r.elections {
		r.active[e] = new(atomic.Int32)
	}
	return r
}

func dataKey(election string) string { return "data/" + election }

// start starts a member, with the rig's options and extra; it leaves the
// group when the test ends.
func (r *groupRig) start(name string, extra ...leader.Option) *groupMember {
	return r.startOn(name, dial(r.tb, r.srv.Addr()), extra...)
}

// startOn starts a member on client c, which other members may share.
func (r *groupRig) startOn(name string, c *sskv.Client, extra ...leader.Option) *groupMember {
	opts := append(slices.Clone(r.opts), extra...)
	g, err := leader.NewGroup(c, "shards", r.elections, []byte(name), append(opts, leader.WithCandidateID(name))...)
	if err != nil {
		r.tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &groupMember{name: name, c: c, g: g, stop: cancel, done: make(chan struct{})}
	go func() {
		m.err = g.Run(ctx, r.work(c))
		close(m.done)
	}()
	r.tb.Cleanup(func() { cancel(); <-m.done }) // before the client closes
	r.members = append(r.members, m)
	return m
}

// work is the work of every term: it counts itself in active, writes its
// election's key fenced with its term every r.every, and records its term
// once its context ends.
func (r *groupRig) work(c *sskv.Client) func(context.Context, *leader.Term) error {
	return func(ctx context.Context, t *leader.Term) error {
		e := t.Election()
		if n := r.active[e].Add(1); n != 1 {
			r.tb.Errorf("%d works of election %s at once", n, e)
		}
		defer func() {
			r.active[e].Add(-1)
			r.mu.Lock()
			r.quit[e] = time.Now()
			r.mu.Unlock()
		}()
		r.mu.Lock()
		r.began[e] = begun{t.CandidateID(), time.Now()}
		r.mu.Unlock()
		w := fenced.New(c, t)
		tick := time.NewTicker(r.every)
		defer tick.Stop()
		for {
			_, err := w.Set(ctx, dataKey(e), []byte(t.CandidateID()), sskv.SetOptions{})
			switch {
			case err == nil:
				r.wrote(e, t.Token())
			case errors.Is(err, sskv.ErrFencingTokenLower):
				r.tb.Errorf("election %s: the store refused a write of a term (%s, %v) that its holder still led: %v", e, t.CandidateID(), t.Token(), err)
			}
			select {
			case <-ctx.Done():
				if errors.Is(context.Cause(ctx), leader.ErrTransferred) {
					r.handedOver.Add(1)
				}
				r.mu.Lock()
				r.ended = append(r.ended, t)
				r.mu.Unlock()
				return nil
			case <-tick.C:
			}
		}
	}
}

func (r *groupRig) wrote(e string, token hlc.Timestamp) {
	r.writes.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if token.Before(r.last[e]) {
		r.tb.Errorf("election %s: a write with token %v accepted after one with %v", e, token, r.last[e])
	}
	if token.After(r.last[e]) {
		r.last[e] = token
	}
}

// live returns the members whose Run runs.
func (r *groupRig) live() []*groupMember {
	var ms []*groupMember
	for _, m := range r.members {
		select {
		case <-m.done:
		default:
			ms = append(ms, m)
		}
	}
	return ms
}

// kill closes m's client abruptly: no resignation, no release; its keys
// expire after the TTL. Run returns an error wrapping sskv.ErrClosed.
func (r *groupRig) kill(m *groupMember) {
	_ = m.c.Close()
	<-m.done
	if !errors.Is(m.err, sskv.ErrClosed) {
		r.tb.Errorf("Run of a member whose client was closed = %v; want sskv.ErrClosed", m.err)
	}
}

// balanced reports whether the live members see each other and each lead
// ⌊E/M⌋ or ⌈E/M⌉ elections, all E led.
func (r *groupRig) balanced() bool {
	ms := r.live()
	e := len(r.elections)
	lo, hi := e/len(ms), (e+len(ms)-1)/len(ms)
	total := 0
	for _, m := range ms {
		n := len(m.g.Leading())
		if n < lo || n > hi || len(m.g.Members()) != len(ms) {
			return false
		}
		total += n
	}
	return total == e
}

// await polls cond until it holds and returns how long that took, or fails
// after limit.
func (r *groupRig) await(what string, limit time.Duration, cond func() bool) time.Duration {
	r.tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			r.tb.Fatalf("%s: not within %v; leading: %s", what, limit, r.counts())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

func (r *groupRig) counts() string {
	s := ""
	for _, m := range r.live() {
		s += fmt.Sprintf("%s %d (sees %d members) ", m.name, len(m.g.Leading()), len(m.g.Members()))
	}
	return s
}

// ledBy reports whether every one of elections is led by a live member.
func (r *groupRig) ledBy(elections []string) bool {
	led := map[string]bool{}
	for _, m := range r.live() {
		for _, e := range m.g.Leading() {
			led[e] = true
		}
	}
	for _, e := range elections {
		if !led[e] {
			return false
		}
	}
	return true
}

// checkObserved checks that Leaders, as an observer sees it, agrees with
// the members: each election whose term lasted from before the read to
// after it is led by the member that has the term, with its token.
func (r *groupRig) checkObserved(c *sskv.Client) {
	r.tb.Helper()
	type held struct {
		m *groupMember
		t *leader.Term
	}
	before := map[string]held{}
	for _, m := range r.live() {
		for _, e := range m.g.Leading() {
			if t := m.g.Term(e); t != nil {
				before[e] = held{m, t}
			}
		}
	}
	states, err := leader.Leaders(testCtx(r.tb), c, r.elections)
	if err != nil {
		r.tb.Fatal(err)
	}
	checked := 0
	for e, h := range before {
		if h.t.Err() != nil || h.m.g.Term(e) != h.t {
			continue // the term ended meanwhile
		}
		checked++
		if s := states[e]; s.ID != h.m.name || string(s.Value) != h.m.name || s.Token != h.t.Token() {
			r.tb.Errorf("Leaders()[%s] = %s %q %v; want %s, its term %v", e, s.ID, s.Value, s.Token, h.m.name, h.t.Token())
		}
	}
	if checked < len(r.elections)/2 {
		r.tb.Errorf("only %d of %d elections led throughout Leaders", checked, len(r.elections))
	}
}

// checkStale checks that terms whose work has returned can no longer
// write: their fenced writer refuses to send, and the store refuses a
// write with their token once a later term has written.
func (r *groupRig) checkStale(c *sskv.Client) int {
	r.tb.Helper()
	r.mu.Lock()
	ended := slices.Clone(r.ended)
	last := maps.Clone(r.last)
	r.mu.Unlock()
	ctx := testCtx(r.tb)
	checked := 0
	for _, t := range ended {
		if checked == 64 {
			break
		}
		e := t.Election()
		if !t.Token().Before(last[e]) {
			continue // no later term has written
		}
		if t.Err() == nil {
			continue // handed over, its resign under way
		}
		if _, err := fenced.New(c, t).Set(ctx, dataKey(e), []byte("stale"), sskv.SetOptions{}); !errors.Is(err, fenced.ErrStale) {
			r.tb.Errorf("election %s: a fenced write of an ended term = %v; want fenced.ErrStale", e, err)
		}
		if _, err := c.Set(ctx, dataKey(e), []byte("stale"), sskv.SetOptions{FencingToken: t.Token()}); !errors.Is(err, sskv.ErrFencingTokenLower) {
			r.tb.Errorf("election %s: a write with an ended term's token = %v; want sskv.ErrFencingTokenLower", e, err)
		}
		checked++
	}
	return checked
}

// TestGroup: elections on three members, balanced; one killed, its
// elections taken over within TTL + 1 s and balanced over the two left;
// two more join, one of them the fourth, which then leads E/4. At every
// moment at most one work runs per election, and writes fenced with an
// ended term are refused.
func TestGroup(t *testing.T) {
	const (
		e   = 100
		ttl = 2 * time.Second
	)
	r := newGroupRig(t, e, time.Second, leader.WithTTL(ttl))
	observer := dial(t, r.srv.Addr())
	var a, b, c *groupMember
	for i, name := range []string{"a", "b", "c"} {
		m := r.start(name)
		switch i {
		case 0:
			a = m
		case 1:
			b = m
		default:
			c = m
		}
	}
	took := r.await("3 members balanced", 10*time.Second, r.balanced)
	t.Logf("3 members: balanced in %v (%s)", took, r.counts())
	r.checkObserved(observer)
	// Once balanced, a member campaigns in no election it does not lead:
	// it watches none of their keys.
	r.await("no member watching an election it does not lead", 5*time.Second, func() bool {
		for _, m := range r.live() {
			led := m.g.Leading()
			for _, e := range r.elections {
				if !slices.Contains(led, e) && r.srv.Watching(m.c.ID(), e) {
					return false
				}
			}
		}
		return true
	})

	// A member crashes.
	orphans := c.g.Leading()
	killed := time.Now()
	r.kill(c)
	r.await("the killed member's elections led again", ttl+time.Second, func() bool { return r.ledBy(orphans) })
	t.Logf("killed %s: its %d elections led again in %v (TTL %v)", c.name, len(orphans), time.Since(killed), ttl)
	took = r.await("2 members balanced", 10*time.Second, r.balanced)
	t.Logf("2 members: balanced %v later (%s)", took, r.counts())
	r.checkObserved(observer)

	// A replacement joins, then a fourth member.
	r.start("c2")
	took = r.await("3 members balanced again", 30*time.Second, r.balanced)
	t.Logf("c2 joined: balanced in %v (%s)", took, r.counts())
	d := r.start("d")
	took = r.await("the fourth member leading E/4", 30*time.Second, func() bool {
		n := len(d.g.Leading())
		return n >= e/4 && n <= (e+3)/4
	})
	t.Logf("d joined: leads %d in %v", len(d.g.Leading()), took)
	r.await("4 members balanced", 30*time.Second, r.balanced)
	r.checkObserved(observer)

	// A member leaves gracefully: its elections are handed over without
	// waiting for the TTL.
	left := a.g.Leading()
	start := time.Now()
	a.stop()
	<-a.done
	if a.err == nil || !errors.Is(a.err, context.Canceled) {
		t.Errorf("Run after its ctx ended = %v; want context.Canceled", a.err)
	}
	r.await("the leaving member's elections led again", ttl, func() bool { return r.ledBy(left) })
	t.Logf("a left: its %d elections led again in %v", len(left), time.Since(start))
	r.await("3 members balanced after a leave", 10*time.Second, r.balanced)

	if n := r.checkStale(observer); n == 0 {
		t.Errorf("no ended term checked")
	} else {
		t.Logf("%d ended terms refused; %d fenced writes accepted", n, r.writes.Load())
	}
	_ = b
}

// TestGroupStoreRestart: a store restart loses every slot and term; the
// members' terms end, they join again after the hold-off and balance
// again, never with two works of an election at once.
func TestGroupStoreRestart(t *testing.T) {
	const ttl = time.Second
	r := newGroupRig(t, 30, 300*time.Millisecond, leader.WithTTL(ttl))
	for _, name := range []string{"a", "b", "c"} {
		r.start(name)
	}
	r.await("3 members balanced", 10*time.Second, r.balanced)
	before := r.writes.Load()
	start := time.Now()
	r.srv = storetest.Restart(t, r.srv, 100*time.Millisecond)
	// The restarted store starts its tokens afresh, with its keys.
	r.mu.Lock()
	clear(r.last)
	r.ended = nil
	r.mu.Unlock()
	r.await("the members' terms to end", 5*time.Second, func() bool {
		for _, m := range r.live() {
			if len(m.g.Leading()) > 0 {
				return false
			}
		}
		return true
	})
	r.await("3 members balanced after the restart", 20*time.Second, func() bool {
		return r.balanced() && r.writes.Load() > before
	})
	t.Logf("balanced again %v after the restart (TTL %v)", time.Since(start), ttl)
	if len(r.live()) != 3 {
		t.Fatalf("a member's Run returned: %s", r.counts())
	}
}

// TestGroupPausedMember: a member whose connection freezes loses its slot
// and its terms on its own clock; the others take its elections over once
// the keys expire; it reconnects, joins again and gets its share back. At
// no moment do two works of an election run.
func TestGroupPausedMember(t *testing.T) {
	const ttl = time.Second
	r := newGroupRig(t, 30, 300*time.Millisecond, leader.WithTTL(ttl))
	var a *groupMember
	for _, name := range []string{"a", "b", "c"} {
		if m := r.start(name); a == nil {
			a = m
		}
	}
	r.await("3 members balanced", 10*time.Second, r.balanced)
	orphans := a.g.Leading()
	if err := r.srv.Hold(a.c.ID(), localstore.Both); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.await("the frozen member's elections led by the others", 3*ttl+2*time.Second, func() bool {
		led := map[string]bool{}
		for _, m := range r.live() {
			if m != a {
				for _, e := range m.g.Leading() {
					led[e] = true
				}
			}
		}
		for _, e := range orphans {
			if !led[e] {
				return false
			}
		}
		return true
	})
	t.Logf("the frozen member's %d elections led by the others after %v", len(orphans), time.Since(start))
	r.await("3 members balanced again", 20*time.Second, r.balanced)
	t.Logf("balanced again %v after the freeze", time.Since(start))
	if len(r.live()) != 3 {
		t.Fatalf("a member's Run returned: %s", r.counts())
	}
}

// TestGroupFull: with every slot taken, a member waits and leads nothing;
// when a member leaves, it joins and gets its share.
func TestGroupFull(t *testing.T) {
	r := newGroupRig(t, 10, 300*time.Millisecond, leader.WithTTL(time.Second), leader.WithMaxMembers(2))
	a := r.start("a")
	r.start("b")
	r.await("2 members balanced", 10*time.Second, r.balanced)
	c := r.start("c")
	r.await("c to see the members", 5*time.Second, func() bool { return len(c.g.Members()) == 2 })
	if n := len(c.g.Leading()); n != 0 || slices.Contains(c.g.Members(), "c") {
		t.Fatalf("c, with no slot free, leads %d and sees members %v", n, c.g.Members())
	}
	a.stop()
	<-a.done
	r.await("b and c balanced", 10*time.Second, r.balanced)
}
