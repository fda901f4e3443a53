package leader_test

// Stress tests of groups (run only when DSSLOCK_STRESS is set; see
// stressOnly in package lock's tests): a member cut off through a TCP proxy
// (partitioned, or frozen and then healed so that what it had sent arrives
// late), and store restarts while a member is away. The rig's work checks
// that no two works of an election ever run at once and that fenced writes
// are accepted in token order.

import (
	"os"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
)

// startVia starts a member whose client reaches the store through a
// fault proxy, and returns the proxy too.
func (r *groupRig) startVia(name string) (*groupMember, *faultproxy.Proxy) {
	p := proxied(r.tb, r.srv.Addr())
	return r.startOn(name, dial(r.tb, p.Addr())), p
}

// othersLead reports whether every one of elections is led by a live
// member other than m.
func (r *groupRig) othersLead(m *groupMember, elections []string) bool {
	led := map[string]bool{}
	for _, o := range r.live() {
		if o != m {
			for _, e := range o.g.Leading() {
				led[e] = true
			}
		}
	}
	for _, e := range elections {
		if !led[e] {
			return false
		}
	}
	return true
}

// TestStressGroupPartitionedMember: a member partitioned from the store (its
// connection cut, and every reconnect refused) for several TTLs: its terms
// end on its own clock, the others take its elections, and once healed it
// joins again. Never two works of an election at once.
func TestStressGroupPartitionedMember(t *testing.T) {
	stressOnly(t)
	const ttl = time.Second
	r := newGroupRig(t, 30, 100*time.Millisecond, leader.WithTTL(ttl))
	a, pa := r.startVia("a")
	r.start("b")
	r.start("c")
	r.await("3 members balanced", 10*time.Second, r.balanced)
	orphans := a.g.Leading()
	pa.Partition()
	start := time.Now()
	r.await("a's terms to end", 2*ttl, func() bool { return len(a.g.Leading()) == 0 })
	r.await("the others to lead a's elections", 5*ttl, func() bool { return r.othersLead(a, orphans) })
	t.Logf("partitioned: the others lead a's %d elections %v later", len(orphans), time.Since(start))
	time.Sleep(ttl)
	pa.Heal()
	r.await("3 members balanced again", 20*time.Second, r.balanced)
}

// TestStressGroupFrozenThenHealed: a member's connection freezes (a
// blackhole: the sockets stay open, nothing passes) and is healed at
// various moments, before and after the member gave up on it, so that
// what it had sent (renewals, campaigns, resigns, fenced writes) reaches
// the store late.
func TestStressGroupFrozenThenHealed(t *testing.T) {
	stressOnly(t)
	const ttl = time.Second
	for _, freeze := range []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, 1200 * time.Millisecond, 2500 * time.Millisecond} {
		t.Run(freeze.String(), func(t *testing.T) {
			r := newGroupRig(t, 30, 50*time.Millisecond, leader.WithTTL(ttl))
			_, pa := r.startVia("a")
			r.start("b")
			r.start("c")
			r.await("3 members balanced", 10*time.Second, r.balanced)
			for range 3 {
				pa.Blackhole()
				time.Sleep(freeze)
				pa.Heal()
				r.await("3 members balanced again", 20*time.Second, r.balanced)
			}
		})
	}
}

// TestStressGroupRestartWhilePartitioned: the store restarts while a member
// is partitioned from it; the member comes back after the others have
// taken every election on the restarted store.
func TestStressGroupRestartWhilePartitioned(t *testing.T) {
	stressOnly(t)
	const ttl = time.Second
	r := newGroupRig(t, 30, 100*time.Millisecond, leader.WithTTL(ttl))
	a, pa := r.startVia("a")
	r.start("b")
	r.start("c")
	r.await("3 members balanced", 10*time.Second, r.balanced)
	pa.Partition()
	time.Sleep(ttl / 3)
	r.srv = storetest.Restart(t, r.srv, 100*time.Millisecond)
	r.mu.Lock()
	clear(r.last)
	r.ended = nil
	r.mu.Unlock()
	r.await("the others to lead every election", 10*ttl, func() bool { return r.othersLead(a, r.elections) })
	pa.Heal()
	r.await("3 members balanced again", 20*time.Second, r.balanced)
}

// stressOnly skips t unless DSSLOCK_STRESS is set.
func stressOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("DSSLOCK_STRESS") == "" {
		t.Skip("a stress test: set DSSLOCK_STRESS=1 to run it")
	}
}
