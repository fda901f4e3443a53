package harness_test

import (
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestCheckHoldings feeds the windows check histories of holdings, with
// and without the overlaps it is there to catch.
func TestCheckHoldings(t *testing.T) {
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	type hold struct {
		who, slot  string
		start, end int64   // ms
		confirmed  []int64 // ms
		deleted    bool    // its key deleted by hand at 100 ms
	}
	for _, c := range []struct {
		name  string
		limit int
		holds []hold
		want  []string // the violations' prefixes, in order
	}{
		{"two slots, one after another on each", 2, []hold{
			{"a", "slot 0", 0, 100, []int64{10, 90}, false},
			{"b", "slot 1", 5, 200, []int64{20, 190}, false},
			{"c", "slot 0", 100, 300, []int64{110, 290}, false},
		}, nil},
		{"three at once", 2, []hold{
			{"a", "slot 0", 0, 400, []int64{10, 390}, false},
			{"b", "slot 1", 5, 400, []int64{20, 390}, false},
			{"c", "slot 2", 50, 400, []int64{60}, false},
		}, []string{"more than 2 holders"}},
		{"three at once, twice", 2, []hold{
			{"a", "slot 0", 0, 400, []int64{10, 390}, false},
			{"b", "slot 1", 5, 400, []int64{20, 390}, false},
			{"c", "slot 2", 50, 100, []int64{60}, false},
			{"d", "slot 3", 200, 300, []int64{210}, false},
		}, []string{"more than 2 holders", "more than 2 holders at 1 more"}},
		{"a third believed it held, with no write accepted since the others started", 2, []hold{
			{"a", "slot 0", 0, 400, []int64{10, 40}, false},
			{"b", "slot 1", 50, 400, []int64{60, 390}, false},
			{"c", "slot 0", 55, 400, []int64{70, 390}, false},
		}, nil},
		{"two of one slot", 2, []hold{
			{"a", "slot 0", 0, 400, []int64{10, 200}, false},
			{"c", "slot 0", 150, 400, []int64{160, 390}, false},
		}, []string{"two holders of slot 0"}},
		{"two of one slot, one's key deleted by hand", 2, []hold{
			{"a", "slot 0", 0, 400, []int64{10, 140}, true},
			{"c", "slot 0", 150, 400, []int64{160, 390}, false},
		}, nil},
		{"two of one slot, one's key deleted by hand, and it went on", 2, []hold{
			{"a", "slot 0", 0, 1000, []int64{10, 200, 900}, true},
			{"c", "slot 0", 150, 400, []int64{160, 390}, false},
		}, []string{"two holders of slot 0"}},
		{"no bound on the count, one per election", 0, []hold{
			{"a", "e0", 0, 400, []int64{10, 390}, false},
			{"b", "e1", 0, 400, []int64{10, 390}, false},
			{"c", "e2", 0, 400, []int64{10, 390}, false},
		}, nil},
		{"windows that touch", 1, []hold{
			{"a", "e0", 0, 400, []int64{10, 100}, false},
			{"b", "e0", 100, 400, []int64{100, 390}, false},
		}, nil},
	} {
		h := newHistory()
		h.lossGrace = 50 * time.Millisecond
		for i, hd := range c.holds {
			r := &termRecord{who: hd.who, lane: i, token: ts(int64(i + 1)), start: ms(hd.start), end: ms(hd.end)}
			x := &holding{who: hd.who, lane: i, slot: hd.slot, token: r.token, start: r.start, end: r.end, term: r}
			for _, at := range hd.confirmed {
				x.confirmed = append(x.confirmed, ms(at))
			}
			if hd.deleted {
				h.keyDeleted(x.token, ms(100), ms(100))
			}
			h.holdings = append(h.holdings, x)
		}
		v := h.checkHoldings(c.limit, "holders")
		ok := len(v) == len(c.want)
		for i := 0; ok && i < len(v); i++ {
			ok = strings.HasPrefix(v[i], c.want[i])
		}
		if !ok {
			t.Errorf("%s: violations %q, want %q", c.name, v, c.want)
		}
	}
}

// TestSharesEven: every election held, counts within one.
func TestSharesEven(t *testing.T) {
	es := groupElections()
	sh := func(holders ...string) shares {
		s := shares{holder: map[string]string{}, ids: []string{"a", "b", "c"}}
		for i, h := range holders {
			s.holder[es[i]] = h
		}
		return s
	}
	for _, c := range []struct {
		s    shares
		want bool
	}{
		{sh("a", "a", "b", "b", "c", "c"), true},
		{sh("a", "a", "a", "b", "b", "c"), false},
		{sh("a", "a", "b", "b", "c", ""), false},    // one not held
		{sh("a", "a", "b", "b", "c", "zed"), false}, // held by a stranger
		{sh("a", "a", "a", "b", "b", "b"), false},   // c has none
	} {
		if got := c.s.even(); got != c.want {
			t.Errorf("%s: even %v, want %v", c.s.counts(), got, c.want)
		}
	}
}

// TestRegisterModelPartitions: with many registers, each is checked on its
// own, and a restart loses them all.
func TestRegisterModelPartitions(t *testing.T) {
	w := func(k, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: regOp{key: k, write: true, value: v}, Output: regOut{}, Call: call, Return: ret}
	}
	r := func(k, v string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: regOp{key: k}, Output: regOut{value: v}, Call: call, Return: ret}
	}
	restart := porcupine.Operation{ClientId: 2, Input: regOp{write: true, restart: true}, Output: regOut{}, Call: 10, Return: 11}
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"each key its own", []porcupine.Operation{w("a", "1", 0, 1), w("b", "2", 2, 3), r("a", "1", 4, 5), r("b", "2", 6, 7)}, true},
		{"a read of another key's value", []porcupine.Operation{w("a", "1", 0, 1), r("b", "1", 4, 5)}, false},
		{"a restart loses both", []porcupine.Operation{w("a", "1", 0, 1), w("b", "2", 2, 3), restart, r("a", "", 12, 13), r("b", "", 14, 15)}, true},
		{"a key survives a restart", []porcupine.Operation{w("a", "1", 0, 1), w("b", "2", 2, 3), restart, r("a", "", 12, 13), r("b", "2", 14, 15)}, false},
	} {
		if got := porcupine.CheckOperations(registerModel, c.ops); got != c.want {
			t.Errorf("%s: linearizable %v, want %v", c.name, got, c.want)
		}
	}
}
