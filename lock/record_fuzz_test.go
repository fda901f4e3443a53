package lock

import (
	"bytes"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// FuzzRecords reads arbitrary values as the records a Semaphore and Holder
// read from the store: no panic, a limit only from a record a Semaphore
// writes, and a holder only from the value's first line or the whole of it.
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
		// A holder is the value's first line, or the whole value when it
		// is not a record ParseHolder knows.
		if h := ParseHolder(b, ts); b != nil {
			id, _, _ := bytes.Cut(b, []byte{'\n'})
			if h.ID != string(id) && h.ID != string(b) {
				t.Fatalf("the value %q reads as holder %q", b, h.ID)
			}
		}
	})
}
