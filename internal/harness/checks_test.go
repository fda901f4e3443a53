package harness_test

import (
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/dsslock/dsslock/hlc"
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

func TestRegisterModel(t *testing.T) {
	w := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: regOp{write: true, value: v}, Output: regOut{}, Call: call, Return: ret}
	}
	r := func(v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: regOp{}, Output: regOut{value: v}, Call: call, Return: ret}
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
	for seed := int64(1); seed <= 6; seed++ {
		r := runSchedule(t, seed, variant{unfenced: true})
		for _, v := range r.violations {
			if strings.Contains(v, "terms interleave") {
				t.Logf("seed %d: found %q", seed, v)
				return
			}
		}
	}
	t.Fatal("six schedules of unfenced leaders showed no interleaved terms")
}
