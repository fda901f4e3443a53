package harness_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// The checks must catch what they are there to catch: these feed them
// histories with the bugs they look for.

func ts(wall int64) hlc.Timestamp { return hlc.Timestamp{Wall: wall, Node: "store"} }

func TestCheckTokensCatchesInterleavedTerms(t *testing.T) {
	h := newHistory()
	h.write(0, "a", "a1", ts(10), false, 0, sskv.SetResult{Applied: true, Version: ts(11)}, nil)
	h.write(1, "b", "b1", ts(20), false, 1, sskv.SetResult{Applied: true, Version: ts(21)}, nil)
	h.write(0, "a", "a2", ts(10), true, 2, sskv.SetResult{Applied: true, Version: ts(22)}, nil) // stale, accepted
	v := h.checkTokens()
	if len(v) != 1 || !strings.Contains(v[0], "terms interleave") {
		t.Fatalf("violations %q, want one interleaving", v)
	}
	if v := newHistory().checkTokens(); len(v) != 0 {
		t.Fatalf("empty history: %q", v)
	}
}

// TestCheckTokensAcrossRestarts: a restarted store's clock may be behind
// the old one's, so versions and tokens are ordered by store first; and a
// term of the old store must not write after a term of the new one has,
// unless it is a paused write whose only obstacle was the lost fence.
func TestCheckTokensAcrossRestarts(t *testing.T) {
	on := func(node string, wall int64) hlc.Timestamp { return hlc.Timestamp{Wall: wall, Node: node} }
	ok := sskv.SetResult{Applied: true}
	at := func(v hlc.Timestamp) sskv.SetResult { r := ok; r.Version = v; return r }
	for _, c := range []struct {
		name   string
		writes func(h *history)
		want   string
	}{
		{"the next term writes to the new store, whose clock is behind", func(h *history) {
			h.write(2, "c", "c1", on("s1", 20), false, 2, at(on("s1", 50)), nil)
		}, ""},
		{"the old store's last term goes on in the new store, then the next term", func(h *history) {
			h.write(1, "b", "b2", on("s0", 110), false, 2, at(on("s1", 40)), nil)
			h.write(2, "c", "c1", on("s1", 20), false, 3, at(on("s1", 50)), nil)
		}, ""},
		{"an old term writes after the new store's term", func(h *history) {
			h.write(2, "c", "c1", on("s1", 20), false, 2, at(on("s1", 50)), nil)
			h.write(1, "b", "b2", on("s0", 110), false, 3, at(on("s1", 60)), nil)
		}, "terms interleave"},
		{"a paused write of an old term after the new store's term", func(h *history) {
			h.write(2, "c", "c1", on("s1", 20), false, 2, at(on("s1", 50)), nil)
			h.write(1, "b", "b2", on("s0", 110), true, 3, at(on("s1", 60)), nil)
			h.write(2, "c", "c2", on("s1", 20), false, 4, at(on("s1", 70)), nil)
		}, ""},
	} {
		h := newHistory()
		h.storeStarted("s0")
		h.storeStarted("s1")
		h.write(0, "a", "a1", on("s0", 100), false, 0, at(on("s0", 101)), nil)
		h.write(1, "b", "b1", on("s0", 110), false, 1, at(on("s0", 111)), nil)
		c.writes(h)
		v := h.checkTokens()
		switch {
		case c.want == "" && len(v) > 0:
			t.Errorf("%s: violations %q, want none", c.name, v)
		case c.want != "" && (len(v) != 1 || !strings.Contains(v[0], c.want)):
			t.Errorf("%s: violations %q, want one %q", c.name, v, c.want)
		}
	}
}

func TestRegisterModel(t *testing.T) {
	w := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: regOp{write: true, value: v}, Output: regOut{}, Call: call, Return: ret}
	}
	r := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: regOp{}, Output: regOut{value: v}, Call: call, Return: ret}
	}
	restart := func(call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 2, Input: regOp{write: true, restart: true}, Output: regOut{}, Call: call, Return: ret}
	}
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"read own write", []porcupine.Operation{w("a", 0, 1), r("a", 2, 3)}, porcupine.Ok},
		{"acknowledged write lost", []porcupine.Operation{w("a", 0, 1), r("", 2, 3)}, porcupine.Illegal},
		{"stale read", []porcupine.Operation{w("a", 0, 1), w("b", 2, 3), r("a", 4, 5)}, porcupine.Illegal},
		{"unknown write may land late", []porcupine.Operation{w("a", 0, unknownReturn), r("", 2, 3), r("a", 4, 5)}, porcupine.Ok},
		{"a refused write (not in the history) is read", []porcupine.Operation{r("x", 0, 1)}, porcupine.Illegal},
		{"a restart loses the register", []porcupine.Operation{w("a", 0, 1), restart(2, 5), r("", 6, 7)}, porcupine.Ok},
		{"read during a restart, before the loss", []porcupine.Operation{w("a", 0, 1), restart(2, 5), r("a", 3, 4), r("", 6, 7)}, porcupine.Ok},
		{"the register survives a restart", []porcupine.Operation{w("a", 0, 1), restart(2, 5), r("a", 6, 7)}, porcupine.Illegal},
		{"lost before the restart", []porcupine.Operation{w("a", 0, 1), r("", 2, 3), restart(4, 5)}, porcupine.Illegal},
		{"a write after the restart stays", []porcupine.Operation{restart(0, 1), w("b", 2, 3), r("b", 4, 5)}, porcupine.Ok},
	} {
		if got := porcupine.CheckOperations(registerModel, c.ops); (got && c.want != porcupine.Ok) || (!got && c.want == porcupine.Ok) {
			t.Errorf("%s: linearizable %v, want %s", c.name, got, c.want)
		}
	}
}

// TestHarnessCatchesUnfencedWrites runs schedules whose leaders write the
// register without their token: a paused leader's late write then lands
// after the next leader's, and the harness must say so.
func TestHarnessCatchesUnfencedWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("runs fault schedules")
	}
	// Three at a time, as the paused writes that show it are a fraction of
	// the faults drawn: one by one, this would take as long as TestHarness.
	var mu sync.Mutex
	var found []string
	slots := make(chan struct{}, 3)
	t.Run("schedules", func(t *testing.T) {
		for seed := int64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				t.Parallel()
				slots <- struct{}{}
				defer func() { <-slots }()
				for _, v := range runSchedule(t, seed, 0, variant{unfenced: true}, nil).violations {
					if strings.Contains(v, "terms interleave") {
						mu.Lock()
						found = append(found, fmt.Sprintf("seed %d: %s", seed, v))
						mu.Unlock()
					}
				}
			})
		}
	})
	if len(found) == 0 {
		t.Fatal("six schedules of unfenced leaders showed no interleaved terms")
	}
	t.Logf("found %d, the first: %s", len(found), found[0])
}

// TestObserverCatchesTermsThatGoOn feeds the observer's checks the states of
// terms whose key was deleted or taken, or re-created by an older term, with
// that term still leading (a violation) or ended: fine if a fault held its
// requests back (a late request that re-created a key is counted), a
// violation if none did.
func TestObserverCatchesTermsThatGoOn(t *testing.T) {
	on := func(node string, wall int64) hlc.Timestamp { return hlc.Timestamp{Wall: wall, Node: node} }
	a := leader.State{ID: "a", Token: on("s0", 10)}
	b := leader.State{ID: "b", Token: on("s0", 20)}
	none := leader.State{}
	resync := func(s leader.State) leader.State { s.Resync = true; return s }
	for _, c := range []struct {
		name      string
		states    []leader.State
		aLeads    bool   // a's terms still lead when checked
		delayed   bool   // a fault held back a's requests throughout
		violation string // the one expected, if any
		late      int
		key       string // what the key holds when a term found leading is checked: "a", "b", "none"; "": not read
	}{
		{"a term, a Resync of it, the next", []leader.State{none, a, resync(a), none, b}, false, false, "", 0, ""},
		{"a goes on after its key was taken", []leader.State{a, b}, true, false, "a term outlived its key", 0, ""},
		{"a goes on after b", []leader.State{a, b, none, a}, true, false, "a term outlived its key", 0, ""},
		{"a's key re-created by a late request after b", []leader.State{a, b, none, a}, false, true, "", 1, ""},
		{"a's key re-created by a request sent again after b", []leader.State{a, b, none, a}, false, false, "a client re-created its ended term's key by itself", 0, ""},
		{"a goes on after its key was deleted", []leader.State{a, none, a}, true, false, "a term outlived its key", 0, ""},
		{"a's held renewal re-created its deleted key, nobody between", []leader.State{a, none, a}, true, true, "", 1, ""},
		{"a's held renewal re-created its key after b", []leader.State{a, b, none, a}, true, true, "a term outlived its key", 0, ""},
		{"a new term with an older token", []leader.State{b, none, a}, true, false, "term token went back", 0, ""},
		{"a new store whose clock is behind", []leader.State{b, resync(none), {ID: "a", Token: on("s1", 5)}}, true, false, "", 0, ""},
		// leader.Observe does not report again a term it saw end: the
		// check reads the key itself (seed 1008).
		{"a's held renewal re-created its deleted key, the observer silent", []leader.State{a, none}, true, true, "", 1, "a"},
		{"a goes on, its deleted key missing", []leader.State{a, none}, true, true, "a term outlived its key", 0, "none"},
		{"a's renewal re-created its deleted key, not held up", []leader.State{a, none}, true, false, "a term outlived its key", 0, "a"},
		{"a's key has a's record, but b led in between", []leader.State{a, none, b, none}, true, true, "a term outlived its key", 0, "a"},
		{"a goes on, b's record in the key", []leader.State{a, none, b}, true, true, "a term outlived its key", 0, "b"},
	} {
		h := newHistory()
		h.lossGrace = 0
		if c.key != "" {
			// The check must come after the states: whether another term
			// led in between is judged up to it.
			h.lossGrace = 100 * time.Millisecond
			key := map[string]hlc.Timestamp{"a": a.Token, "b": b.Token, "none": {}}[c.key]
			h.readKey = func() (hlc.Timestamp, string, error) { return key, c.key, nil }
		}
		h.storeStarted("s0")
		h.storeStarted("s1")
		h.termStarted(0, "a", a.Token, func() bool { return c.aLeads })
		h.termStarted(0, "a", on("s1", 5), func() bool { return c.aLeads })
		if c.delayed {
			h.delayed("a", 0, time.Hour.Nanoseconds())
		}
		for _, st := range c.states {
			h.observed(st)
		}
		v, late := h.checkObserver()
		switch {
		case c.violation == "" && len(v) > 0, c.violation != "" && (len(v) != 1 || !strings.HasPrefix(v[0], c.violation)):
			t.Errorf("%s: violations %q, want %q", c.name, v, c.violation)
		case len(late) != c.late:
			t.Errorf("%s: late %q, want %d", c.name, late, c.late)
		}
	}

	// A term that led when the store was closed must stop leading, even if
	// its record is in the next store's key and a fault held its requests:
	// none of them can reach the next store.
	for _, leads := range []bool{false, true} {
		h := newHistory()
		h.lossGrace = 0
		h.termStarted(0, "a", a.Token, func() bool { return leads })
		h.delayed("a", 0, time.Hour.Nanoseconds())
		h.readKey = func() (hlc.Timestamp, string, error) { return a.Token, "a", nil }
		h.storeLost()
		if v, _ := h.checkObserver(); len(v) != map[bool]int{false: 0, true: 1}[leads] {
			t.Errorf("a term that leads (%v) when the store is closed, and after: violations %q", leads, v)
		}
	}

	// A late renewal re-creates a's key just before a acts on the news
	// that the key was deleted: a is given until lossGrace to end.
	h := newHistory()
	h.lossGrace = 100 * time.Millisecond
	ends := time.Now().Add(20 * time.Millisecond)
	h.termStarted(0, "a", a.Token, func() bool { return time.Now().Before(ends) })
	h.delayed("a", 0, h.now())
	for _, st := range []leader.State{a, none, a} {
		h.observed(st)
	}
	if v, late := h.checkObserver(); len(v) != 0 || len(late) != 1 {
		t.Errorf("a ends soon after its late renewal: violations %q, late %q; want none and one", v, late)
	}
}

// TestStoreRestartLosesKeys: the restart fault must lose every key, keep the
// address, give the new store its own node id, and clients must reconnect.
func TestStoreRestartLosesKeys(t *testing.T) {
	s := &schedule{t: t, h: newHistory(), logger: slog.New(slog.DiscardHandler)}
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	defer s.stopStore()
	addr := s.store().Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: addr, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(ctx, register, []byte("a"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	s.stopStore()
	if err := s.startStore(); err != nil {
		t.Fatal(err)
	}
	if got := s.store().Addr(); got != addr {
		t.Errorf("restarted on %s, want %s", got, addr)
	}
	// A GET sent before the client noticed the restart is lost with the old
	// session; the next goes to the new store.
	g, err := c.Get(ctx, register)
	for errors.Is(err, sskv.ErrConnectionLost) {
		g, err = c.Get(ctx, register)
	}
	if err != nil || g.Found {
		t.Fatalf("Get after the restart: %+v, %v; want the key lost", g, err)
	}
	// The token order tells stores apart by their versions' node ids.
	if r, err := c.Set(ctx, register, []byte("b"), sskv.SetOptions{}); err != nil || r.Version.Node != "statestore2" {
		t.Fatalf("Set after the restart: %+v, %v; want a version of node statestore2", r, err)
	}
}

// TestFailingLogEndsWithViolations: a failing schedule's log, kept without
// the test's output, ends with each violation's full text (the check that
// fired and what it was judged on), then the summary and the replay
// command.
func TestFailingLogEndsWithViolations(t *testing.T) {
	s := &schedule{t: t, seed: -38, run: 1, h: newHistory()}
	s.logger = slog.New(slog.NewTextHandler(&s.log, nil))
	s.logger.Info("a line of the schedule")
	violations := []string{"a term outlived its key: ...\n  judged on:\n    observed at 1s: no leader", "terms interleave: ..."}
	s.evidence(violations, "12 ops, 1 violations")
	path := s.writeLog()
	if path == "" {
		t.Fatal("no log written")
	}
	defer os.Remove(path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "violation 1 of 2: " + violations[0] + "\nviolation 2 of 2: " + violations[1] + "\n" +
		"--- seed -38 (run 1): 12 ops, 1 violations ---\nreplay: " + replayCommand(-38) + "\n"
	if !strings.HasSuffix(string(b), want) {
		t.Fatalf("the log ends with\n%s\nwant\n%s", b[max(0, len(b)-len(want)-100):], want)
	}
}
