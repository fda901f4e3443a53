package leader_test

// Stress tests from an adversarial review: group members sharing one proxied client, whose one
// writer is stuck on a frozen socket by a large SET, against a member on
// its own client. The rig's work checks that no two works of an election
// run at once and that fenced writes go in token order.

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

func TestStressSharedClientGroupSharedStuckWriter(t *testing.T) {
	stressOnly(t)
	for _, tc := range []struct{ patient, restarts bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		patient := tc.patient
		name := "reconnecting"
		if patient {
			name = "patient"
		}
		if tc.restarts {
			name += "/restarts"
		}
		t.Run(name, func(t *testing.T) {
			ttl := time.Second
			r := newGroupRig(t, 20, 50*time.Millisecond, leader.WithTTL(ttl))
			p, err := faultproxy.Start(r.srv.Addr(), faultproxy.Options{BufferSize: 32 << 10})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			var ca *sskv.Client
			if patient {
				ca = storetest.DialPatient(t, p.Addr(), "")
			} else {
				ca = dial(t, p.Addr())
			}
			r.startOn("a1", ca)
			r.startOn("a2", ca)
			r.start("b")
			r.start("c")
			big := []byte(strings.Repeat("x", 1<<20))
			end := time.Now().Add(15 * time.Second)
			for time.Now().Before(end) {
				time.Sleep(time.Duration(500+rand.N(1500)) * time.Millisecond)
				p.Blackhole()
				sctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+rand.N(1500))*time.Millisecond)
				go func() { defer cancel(); _, _ = ca.Set(sctx, "big", big, sskv.SetOptions{}) }()
				time.Sleep(time.Duration(rand.N(2500)) * time.Millisecond)
				if tc.restarts && rand.N(2) == 0 {
					r.srv = storetest.Restart(t, r.srv, time.Duration(rand.N(300))*time.Millisecond)
					time.Sleep(time.Duration(rand.N(1000)) * time.Millisecond)
				}
				p.Heal()
			}
			t.Logf("writes %d", r.writes.Load())
		})
	}
}
