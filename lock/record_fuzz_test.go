package lock

import (
	"bytes"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// FuzzRecords reads arbitrary values as the records a Lock, a Semaphore
// and Holder read from the store: no panic, and a limit only from a record
// a Semaphore writes.
func FuzzRecords(f *testing.F) {
	ts := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	f.Add(SemaphoreRecord(3))
	f.Add([]byte("holder\n001795695934356:00001:statestore\nvalue"))
	f.Add([]byte(",\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := parseSemaphoreRecord(b); ok {
			if n < 1 || n > maxSemaphoreLimit || !bytes.Equal(SemaphoreRecord(n), b) {
				t.Fatalf("record %q gives limit %d", b, n)
			}
		}
		if h := ParseHolder(b, ts); b != nil && !h.Held() {
			t.Fatalf("the value %q reads as a free lock", b)
		}
	})
}
