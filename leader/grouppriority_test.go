package leader_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/dsslock/dsslock/leader"
)

// PriorityAssignment spreads the elections over the members of the highest
// priority present, as Assignment spreads them over those alone; the
// others get none. With one priority for all, it is Assignment.
func TestPriorityAssignment(t *testing.T) {
	if a := leader.PriorityAssignment(nil, shardNames(3)); a != nil {
		t.Errorf("PriorityAssignment with no members = %v", a)
	}
	var ms []string
	for i := range 6 {
		ms = append(ms, fmt.Sprintf("replica-%d/%08x", i, i*2654435761))
	}
	for _, e := range []int{1, 8, 100} {
		es := shardNames(e)
		for m := 1; m <= len(ms); m++ {
			// Every member at one priority: exactly today's assignment.
			for _, p := range []int{0, 5} {
				ps := map[string]int{}
				for _, id := range ms[:m] {
					ps[id] = p
				}
				if a, want := leader.PriorityAssignment(ps, es), leader.Assignment(ms[:m], es); !maps.Equal(a, want) {
					t.Fatalf("E=%d M=%d, all at priority %d: PriorityAssignment differs from Assignment", e, m, p)
				}
			}
			// The first k members at priority 2, the next at 1, the rest
			// at 0: the elections go to the first k, balanced, exactly as
			// Assignment gives them to those alone.
			for k := 1; k <= m; k++ {
				ps := map[string]int{}
				for i, id := range ms[:m] {
					switch {
					case i < k:
						ps[id] = 2
					case i == k:
						ps[id] = 1
					}
				}
				a := leader.PriorityAssignment(ps, es)
				checkBalanced(t, a, ms[:k], es)
				if want := leader.Assignment(ms[:k], es); !maps.Equal(a, want) {
					t.Fatalf("E=%d M=%d, %d at the top: not Assignment of the top members", e, m, k)
				}
			}
		}
	}
	// A member of a higher priority takes every election, whatever the
	// number of members below it.
	ps := map[string]int{"a": 0, "b": 0, "c": 0, "new": 1}
	for e, m := range leader.PriorityAssignment(ps, shardNames(8)) {
		if m != "new" {
			t.Errorf("election %s assigned to %s, not to the member of the higher priority", e, m)
		}
	}
}

func TestGroupPriorityConfig(t *testing.T) {
	srv := startStore(t)
	c := dial(t, srv.Addr())
	for _, tc := range []struct {
		name string
		opts []leader.Option
	}{
		{"negative priority", []leader.Option{leader.WithPriority(-1)}},
		{"member id that reads as carrying a priority", []leader.Option{leader.WithCandidateID("m\x00priority=2")}},
	} {
		if _, err := leader.NewGroup(c, "g", []string{"a"}, nil, tc.opts...); !errors.Is(err, leader.ErrConfig) {
			t.Errorf("%s: NewGroup = %v; want ErrConfig", tc.name, err)
		}
	}
	g, err := leader.NewGroup(c, "g", []string{"a"}, nil, leader.WithPriority(3))
	if err != nil {
		t.Fatal(err)
	}
	if g.Priority() != 3 {
		t.Errorf("Priority = %d; want 3", g.Priority())
	}
}

// leadsAll reports whether m leads every election of the rig and the other
// live members none.
func (r *groupRig) leadsAll(m *groupMember) bool {
	for _, o := range r.live() {
		n := len(o.g.Leading())
		if (o == m && n != len(r.elections)) || (o != m && n != 0) {
			return false
		}
	}
	return true
}

// TestGroupPriority: two members of priority 0 hold every election; a
// member of priority 1 joins and ends up leading every election, the
// others none; a second member of priority 1 joins and the two share them;
// when they leave, the elections spread back over the members of priority
// 0. At every moment at most one work runs per election (the rig's work),
// tokens go up, and writes fenced with an ended term are refused.
func TestGroupPriority(t *testing.T) {
	const ttl = 2 * time.Second
	r := newGroupRig(t, 8, 100*time.Millisecond, leader.WithTTL(ttl))
	observer := dial(t, r.srv.Addr())
	r.start("a")
	r.start("b")
	r.await("a and b balanced", 10*time.Second, r.balanced)

	joined := time.Now()
	h := r.start("h", leader.WithPriority(1))
	took := r.await("h leading every election", 10*time.Second, func() bool { return r.leadsAll(h) })
	t.Logf("h (priority 1) joined: leads all %d elections after %v", len(r.elections), took)
	if n := r.handedOver.Load(); n < int64(len(r.elections)) {
		t.Errorf("%d works ended with ErrTransferred; want every one of the %d handed over", n, len(r.elections))
	}
	r.mu.Lock()
	for e, b := range r.began {
		if b.member == "h" && b.at.Before(joined) {
			t.Errorf("election %s: h's work began before h joined", e)
		}
	}
	r.mu.Unlock()
	for _, m := range r.live() {
		if got := m.g.Members(); !slices.Equal(got, []string{"a", "b", "h"}) {
			t.Errorf("%s sees members %v; want a, b and h", m.name, got)
		}
	}
	r.checkObserved(observer)

	// A second member of priority 1: the two of priority 1 share.
	h2 := r.start("h2", leader.WithPriority(1))
	r.await("h and h2 sharing every election", 10*time.Second, func() bool {
		return len(h.g.Leading())+len(h2.g.Leading()) == len(r.elections) && r.leadTop([]*groupMember{h, h2})
	})
	r.checkObserved(observer)

	// The members of priority 1 leave (Run's context ends): the elections
	// spread back over a and b, without waiting for the TTL.
	h2.stop()
	<-h2.done
	r.await("h leading every election again", 10*time.Second, func() bool { return r.leadsAll(h) })
	left := time.Now()
	h.stop()
	<-h.done
	if !errors.Is(h.err, context.Canceled) {
		t.Errorf("h's Run after its ctx ended = %v; want context.Canceled", h.err)
	}
	r.await("a and b balanced again", ttl, r.balanced)
	t.Logf("h left: a and b balanced again after %v", time.Since(left))
	r.checkObserved(observer)
	if n := r.checkStale(observer); n == 0 {
		t.Errorf("no ended term checked")
	}
}

// leadTop reports whether the live members of top lead the elections
// between them, balanced, and the others lead none.
func (r *groupRig) leadTop(top []*groupMember) bool {
	e := len(r.elections)
	lo, hi := e/len(top), (e+len(top)-1)/len(top)
	for _, m := range r.live() {
		n := len(m.g.Leading())
		if slices.Contains(top, m) != (n >= lo && n <= hi && n > 0) {
			return false
		}
	}
	return true
}

// TestGroupEqualPriorities: members that all have the same priority, given
// or not, lead exactly what Assignment gives them, as before priorities.
func TestGroupEqualPriorities(t *testing.T) {
	for _, opts := range [][]leader.Option{nil, {leader.WithPriority(4)}} {
		t.Run(fmt.Sprintf("options=%d", len(opts)), func(t *testing.T) {
			r := newGroupRig(t, 24, 300*time.Millisecond, append([]leader.Option{leader.WithTTL(time.Second)}, opts...)...)
			names := []string{"a", "b", "c"}
			for _, n := range names {
				r.start(n)
			}
			want := leader.Assignment(names, r.elections)
			r.await("every member leading what Assignment gives it", 10*time.Second, func() bool {
				for _, m := range r.live() {
					var mine []string
					for e, id := range want {
						if id == m.name {
							mine = append(mine, e)
						}
					}
					slices.Sort(mine)
					if !slices.Equal(m.g.Leading(), mine) {
						return false
					}
				}
				return true
			})
		})
	}
}

// BenchmarkGroupPriorityTakeover: two members of priority 0 lead 8
// elections (DSSLOCK_GROUP_ELECTIONS); a member of priority 1 joins.
// Measured from its Run's start to the start of its last work, when it
// leads every election (ms): the settling time (a twentieth of the TTL, 10
// to 100 ms), the handovers (each work returns at once) and the campaigns;
// and, for each election, from the old leader's work returning to the new
// one's starting (gap-ms): the resign and the campaign that was waiting.
// Between iterations it leaves, and the two balance again.
func BenchmarkGroupPriorityTakeover(b *testing.B) {
	e := envInt(b, "DSSLOCK_GROUP_ELECTIONS", 8)
	ttl := time.Duration(envInt(b, "DSSLOCK_GROUP_TTL_MS", 2000)) * time.Millisecond
	r := newGroupRig(b, e, time.Second, leader.WithTTL(ttl))
	r.start("a")
	r.start("b")
	r.await("a and b balanced", 10*time.Second, r.balanced)
	c := dial(b, r.srv.Addr())
	var ds, gaps []time.Duration
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("h%d", i)
		i++
		start := time.Now()
		h := r.startOn(name, c, leader.WithPriority(1))
		r.await("the new member leading every election", 10*time.Second, func() bool { return r.leadsAll(h) })
		var last time.Time
		r.mu.Lock()
		for e, bg := range r.began {
			if bg.member == name && bg.at.After(last) {
				last = bg.at
			}
			gaps = append(gaps, bg.at.Sub(r.quit[e]))
		}
		r.mu.Unlock()
		ds = append(ds, last.Sub(start))
		b.StopTimer()
		h.stop()
		<-h.done
		r.await("a and b balanced again", 10*time.Second, r.balanced)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, ds, "ms")
	reportPercentiles(b, gaps, "gap-ms")
}

// TestGroupPriorityMemberDies: when the member of the highest priority
// dies (no resign, no release), the members of the next priority take
// every election over once its keys expire, about a TTL later, balanced,
// never two works of an election at once.
func TestGroupPriorityMemberDies(t *testing.T) {
	const ttl = time.Second
	r := newGroupRig(t, 8, 100*time.Millisecond, leader.WithTTL(ttl))
	r.start("a")
	r.start("b")
	h := r.start("h", leader.WithPriority(1))
	r.await("h leading every election", 10*time.Second, func() bool { return r.leadsAll(h) })
	killed := time.Now()
	r.kill(h)
	r.await("a and b balanced after h died", ttl+2*time.Second, r.balanced)
	t.Logf("h died: a and b balanced %v later (TTL %v)", time.Since(killed), ttl)
}
