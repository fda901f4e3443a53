package leader

import (
	"strconv"
	"testing"
)

// A slot's value gives the member's id and priority; the value of a member
// of priority 0, and any value written before priorities, is the id alone.
func TestSlotValue(t *testing.T) {
	for _, tc := range []struct {
		v  string
		id string
		p  int
	}{
		{"replica-1/0a1b", "replica-1/0a1b", 0},
		{"a\x00priority=3", "a", 3},
		{"a\x00priority=0", "a\x00priority=0", 0},   // slotValue never writes it
		{"a\x00priority=03", "a\x00priority=03", 0}, // not as slotValue writes it
		{"a\x00priority=-1", "a\x00priority=-1", 0},
		{"a\x00priority=x", "a\x00priority=x", 0},
		{"a\x00priority=99999999999999999999", "a\x00priority=99999999999999999999", 0},
		{"\x00priority=2", "", 2},
		{"", "", 0},
	} {
		if id, p := parseSlot(tc.v); id != tc.id || p != tc.p {
			t.Errorf("parseSlot(%q) = %q, %d; want %q, %d", tc.v, id, p, tc.id, tc.p)
		}
	}
	for _, p := range []int{0, 1, 7, 1 << 40} {
		if id, got := parseSlot(slotValue("m/x y", p)); id != "m/x y" || got != p {
			t.Errorf("round trip of priority %d: %q, %d", p, id, got)
		}
	}
	if v := slotValue("old", 0); v != "old" {
		t.Errorf("slotValue at priority 0 = %q; want the id alone, as before priorities", v)
	}
}

// A slot's value is network input: any value parses without a panic, and
// what parses writes back the same.
func FuzzParseSlot(f *testing.F) {
	for _, s := range []string{"a", "a\x00priority=1", "a\x00priority=01", "\x00priority=", "a\x00priority=1\x00priority=2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		id, p := parseSlot(v)
		switch {
		case p < 0:
			t.Fatalf("parseSlot(%q): priority %d", v, p)
		case p == 0 && id != v:
			t.Fatalf("parseSlot(%q) = %q, 0; want the value as the id", v, id)
		case slotValue(id, p) != v:
			t.Fatalf("parseSlot(%q) = %q, %d, which writes back %q", v, id, p, slotValue(id, p))
		case p > 0 && len(v) != len(id)+len(slotPriorityInfix)+len(strconv.Itoa(p)):
			t.Fatalf("parseSlot(%q) = %q, %d", v, id, p)
		}
	})
}
