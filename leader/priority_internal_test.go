package leader

import "testing"

// The priority and challenge keys are network input: any value parses
// without a panic, and what parses writes back the same.
func FuzzParsePriority(f *testing.F) {
	for _, s := range []string{"a 1", "node-1/ab 10", " 1", "a -1", "a", "a b 2", "a 99999999999999999999", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		id, p, ok := parsePriority(v)
		if !ok {
			return
		}
		if id == "" || p < 0 {
			t.Fatalf("parsePriority(%q) = %q, %d, true", v, id, p)
		}
		id2, p2, ok := parsePriority(priorityValue(id, p))
		if !ok || id2 != id || p2 != p {
			t.Fatalf("round trip of %q: %q, %d, %v", v, id2, p2, ok)
		}
	})
}
