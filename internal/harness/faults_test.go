package harness_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A fault is injected now; heal, when not nil, ends it after dur. A fault
// with skip set did nothing, for that reason.
type fault struct {
	what string
	dur  time.Duration
	heal func()
	skip string
	// delays is the candidate whose requests the fault holds back or slows
	// down, to reach the store late; nil if none. Requests it discards, to
	// be sent again on a new connection, are not delayed.
	delays *candidate
}

// faultKinds are the faults a schedule draws from, with their weights.
var faultKinds = []struct {
	name   string
	weight int
	inject func(s *schedule, cd *candidate, d time.Duration) fault
}{
	// A leader stops between its read and its write for longer than the
	// renew deadline, then writes with the token it had.
	{"pause", 3, func(s *schedule, cd *candidate, d time.Duration) fault {
		p := renewDeadline + d/2
		cd.pause.Store(int64(p))
		return fault{what: fmt.Sprintf("pause %s %v (pending)", cd.id, p.Round(time.Millisecond))}
	}},
	{"kick", 1, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		_ = srv.Kick(cd.id)
		return fault{what: "kick " + cd.id}
	})},
	{"drop", 1, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		_ = srv.Drop(cd.id)
		return fault{what: "drop " + cd.id}
	})},
	{"blackhole", 2, func(s *schedule, cd *candidate, d time.Duration) fault {
		cd.proxy.Blackhole()
		return fault{what: "blackhole " + cd.id, dur: d, heal: cd.proxy.Heal, delays: cd}
	}},
	{"cut", 1, func(s *schedule, cd *candidate, d time.Duration) fault {
		cd.proxy.Cut()
		return fault{what: "cut " + cd.id}
	}},
	{"hold", 2, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		dir := []localstore.Direction{localstore.ToStore, localstore.FromStore, localstore.Both}[int(d)%3]
		names := map[localstore.Direction]string{localstore.ToStore: "to store", localstore.FromStore: "from store", localstore.Both: "both ways"}
		if err := srv.Hold(cd.id, dir); err != nil {
			return fault{what: "hold " + cd.id + ": not connected"}
		}
		return fault{what: fmt.Sprintf("hold %s %s", cd.id, names[dir]), dur: d, heal: func() { srv.Release(cd.id) }, delays: cd}
	})},
	{"drop responses", 1, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		srv.SetResponseFault(cd.id, localstore.ResponseFault{Drop: true})
		return fault{what: "drop responses to " + cd.id, dur: d / 2,
			heal: func() { srv.SetResponseFault(cd.id, localstore.ResponseFault{}) }}
	})},
	{"delay responses", 1, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		delay := d / 4
		srv.SetResponseFault(cd.id, localstore.ResponseFault{Delay: delay})
		return fault{what: fmt.Sprintf("delay responses to %s by %v", cd.id, delay.Round(time.Millisecond)), dur: d,
			heal: func() { srv.SetResponseFault(cd.id, localstore.ResponseFault{}) }}
	})},
	{"network delay", 1, func(s *schedule, cd *candidate, d time.Duration) fault {
		delay := d / 30
		cd.proxy.SetDelay(delay)
		return fault{what: fmt.Sprintf("network delay %s %v", cd.id, delay.Round(time.Millisecond)), dur: d,
			heal: func() { cd.proxy.SetDelay(0) }, delays: cd}
	}},
	// The store's clock jumps to an offset within ±maxSkew (it stays there
	// until the next jump or the end of the faults).
	{"store clock", 1, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		off := time.Duration(int64(d)*7919%int64(2*maxSkew)) - maxSkew
		s.setClockOffset(srv, off)
		return fault{what: fmt.Sprintf("store clock %+v", off.Round(time.Millisecond))}
	})},
	// The store restarts: it is closed, with every key and session, and a
	// new one starts on the same address 0.1 to 2.5 s later. Every client
	// reconnects to a store that knows nothing of it; the register is lost.
	// Short restarts are drawn more often (the downtime is 0.1 s plus 2.4 s
	// times the square of a uniform draw; under 0.3 s in 29% of restarts):
	// a process restart is the common case, and only a leader that comes
	// back within its renew deadline can carry on with a re-created key.
	{"restart", 2, func(s *schedule, cd *candidate, d time.Duration) fault {
		u := float64(d-ttl/2) / float64(3*ttl/2)
		down := 100*time.Millisecond + time.Duration(u*u*float64(2400*time.Millisecond))
		start := s.h.now()
		if s.stopStore() == nil {
			return fault{skip: "no store runs"}
		}
		s.h.storeLost()
		return fault{what: fmt.Sprintf("store restart, down %v", down.Round(time.Millisecond)), dur: down, heal: func() {
			if err := s.startStore(); err != nil {
				s.failures = append(s.failures, err.Error())
			}
			s.h.restarted(s.restartLane, start, s.h.now())
		}}
	}},
	// The election's key (in a semaphore schedule a slot's, in a group
	// schedule one of its elections') is deleted by hand while its holder
	// is away: an
	// administrator reads the key's record, the holder's connection is
	// blackholed (or held both ways), and the administrator deletes the key,
	// fenced with the token it records. Another candidate may take over. Then the path heals,
	// delivering what it held, or the connection is cut, losing it: the
	// leader reconnects at once, resumes its session and sends its
	// unacknowledged requests again.
	{"delete key", 3, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		key := s.faultKey(d)
		g, err := s.admin.Get(ctx, key)
		if err != nil {
			return fault{what: fmt.Sprintf("delete key: GET: %v", err)}
		}
		holder := lock.ParseHolder(g.Value, g.Version)
		cd = s.candidate(holder.ID, s.leaderOr(cd))
		how := int(d) % 4
		away, heal, cut := "blackholed", cd.proxy.Heal, cd.proxy.Cut
		if how&1 == 1 && srv.Hold(cd.id, localstore.Both) == nil {
			away, heal, cut = "held", func() { srv.Release(cd.id) }, func() { _ = srv.Drop(cd.id) }
		} else {
			cd.proxy.Blackhole()
		}
		then, delays := "healed", cd
		if how&2 == 2 {
			then, heal, delays = "cut", cut, nil
		}
		return fault{what: fmt.Sprintf("%s %s, then %s: %s", away, cd.id, then, s.deleteKey(ctx, key, holder)), dur: d / 2, heal: heal, delays: delays}
	})},
	// Requests the store executed are sent again: the traffic from the
	// store to the leader is held (its PUBACKs and responses wait) for
	// 0.15 to 0.75 s, at least a renew interval, so that its requests stay
	// unacknowledged in its MQTT session, and then its connection is
	// dropped. It reconnects, resumes its session, and paho sends every
	// unacknowledged request again (QoS 1), which the store executes again.
	// In about half of them the hold outlasts the renew deadline, and the
	// term ends meanwhile: what is sent again then is a lost term's.
	{"redeliver", 3, onStore(func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault {
		cd = s.leaderOr(cd)
		hold := renewInterval + (d-ttl/2)*2/3
		before := srv.Requests(cd.id)
		if err := srv.Hold(cd.id, localstore.FromStore); err != nil {
			return fault{what: "redeliver " + cd.id + ": not connected"}
		}
		return fault{what: fmt.Sprintf("hold %s from store, then drop it", cd.id), dur: hold, heal: func() {
			n := srv.Requests(cd.id) - before
			_ = srv.Drop(cd.id)
			s.h.fault(s.h.now(), 0, fmt.Sprintf("drop %s: %d requests unacknowledged, to be sent again", cd.id, n))
		}}
	})},
	// A client's clock is set to an offset within ±maxSkew.
	{"client clock", 1, func(s *schedule, cd *candidate, d time.Duration) fault {
		off := time.Duration(int64(d)*104729%int64(2*maxSkew)) - maxSkew
		cd.skew.Store(int64(off))
		return fault{what: fmt.Sprintf("clock of %s %+v", cd.id, off.Round(time.Millisecond))}
	}},
}

// onStore makes a fault that acts on the store running now; while the
// store restarts there is none, and the fault is skipped. Its heal acts on
// the same store (a no-op once that store is closed: what it held or delayed
// was lost with it).
func onStore(inject func(s *schedule, srv *localstore.Server, cd *candidate, d time.Duration) fault) func(*schedule, *candidate, time.Duration) fault {
	return func(s *schedule, cd *candidate, d time.Duration) fault {
		srv := s.store()
		if srv == nil {
			return fault{skip: "no store runs"}
		}
		return inject(s, srv, cd, d)
	}
}

// leaderOr returns the candidate whose work runs as leader now, or cd if
// none does.
func (s *schedule) leaderOr(cd *candidate) *candidate {
	for _, c := range s.cand {
		if c.leading() {
			return c
		}
	}
	return cd
}

// candidate returns the candidate with the given id, or cd if none has it.
func (s *schedule) candidate(id string, cd *candidate) *candidate {
	for _, c := range s.cand {
		if c.id == id {
			return c
		}
	}
	return cd
}

// deleteKey deletes key, read as h, from the administrator's client, fenced
// with the token its record holds, and says what it did. If a newer holder
// has taken the key since it was read, the fence refuses it.
func (s *schedule) deleteKey(ctx context.Context, key string, h lock.Holder) string {
	if !h.Held() {
		return "delete key: nobody holds it"
	}
	call := s.h.now()
	r, err := s.admin.Del(ctx, key, sskv.DelOptions{FencingToken: h.Token})
	if err != nil {
		// It may have been deleted.
		s.h.keyDeleted(h.Token, call, s.h.now())
		return fmt.Sprintf("delete key of %s (token %v): DEL: %v", h.ID, h.Token, err)
	}
	if r.Deleted {
		s.h.keyDeleted(h.Token, call, s.h.now())
	}
	return fmt.Sprintf("delete key of %s (token %v): deleted %v", h.ID, h.Token, r.Deleted)
}

// draw picks a fault kind, a target and a duration. It draws the same
// random numbers whatever the state, so a seed replays the same sequence
// of choices; only the leader-biased target depends on timing.
func (s *schedule) draw() (kind int, cd *candidate, d time.Duration) {
	total := 0
	for _, k := range faultKinds {
		total += k.weight
	}
	w := s.rng.IntN(total)
	for kind = 0; w >= faultKinds[kind].weight; kind++ {
		w -= faultKinds[kind].weight
	}
	leaderFirst := s.rng.IntN(10) < 6
	cd = s.cand[s.rng.IntN(len(s.cand))]
	d = ttl/2 + time.Duration(s.rng.Int64N(int64(3*ttl/2)))
	if leaderFirst {
		for _, c := range s.cand {
			if c.leading() {
				cd = c
				break
			}
		}
	}
	return kind, cd, d
}

// injectFaults injects random faults for faultPhase, each healed after its
// duration, then heals everything (clocks included) and returns how many
// faults of each kind it injected (skipped ones aside).
func (s *schedule) injectFaults(ctx context.Context) map[string]int {
	type pending struct {
		at    time.Time
		start int64
		f     fault
	}
	var open []pending
	heal := func(p pending) {
		p.f.heal()
		s.h.fault(p.start, s.h.now(), p.f.what)
		if p.f.delays != nil {
			s.h.delayed(p.f.delays.id, p.start, s.h.now())
		}
	}
	n := map[string]int{}
	end := time.Now().Add(faultPhase)
	next := time.Now()
	for ctx.Err() == nil {
		now := time.Now()
		open = slices.DeleteFunc(open, func(p pending) bool {
			if now.Before(p.at) {
				return false
			}
			heal(p)
			return true
		})
		if !now.Before(end) {
			break
		}
		if !now.Before(next) {
			kind, cd, d := s.draw()
			start := s.h.now()
			f := faultKinds[kind].inject(s, cd, d)
			if f.skip != "" {
				f.what = faultKinds[kind].name + " skipped: " + f.skip
			} else {
				n[faultKinds[kind].name]++
			}
			if f.heal != nil {
				open = append(open, pending{at: now.Add(f.dur), start: start, f: f})
			} else {
				s.h.fault(start, 0, f.what)
			}
			next = now.Add(20*time.Millisecond + time.Duration(s.rng.Int64N(int64(280*time.Millisecond))))
		}
		wake := next
		if end.Before(wake) {
			wake = end
		}
		for _, p := range open {
			if p.at.Before(wake) {
				wake = p.at
			}
		}
		s.sleep(ctx, time.Until(wake))
	}
	for _, p := range open {
		heal(p)
	}
	if srv := s.store(); srv != nil {
		s.setClockOffset(srv, 0)
	}
	for _, cd := range s.cand {
		cd.skew.Store(0)
		cd.pause.Store(0)
	}
	return n
}
