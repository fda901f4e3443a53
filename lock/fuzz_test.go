package lock

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// The queue's messages, its roll call and the records in lock keys come
// from the store, where any client may have written them: their parsers
// must take any bytes without panicking, and read back what the encoders
// write.

// FuzzQueueMessages feeds arbitrary bytes to every parser of what Locks
// and Semaphores read from the store.
func FuzzQueueMessages(f *testing.F) {
	ts := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	es := []entry{{rec: []byte("a\n~0123456789abcdef\n"), told: toldFirst}, {rec: []byte("b"), told: toldAck}}
	f.Add(turnBody(ts, ts, es)[1:])
	f.Add(appendEntries(nil, es))
	f.Add(expiredBody(ts, []string{"a", "b"})[1:])
	f.Add(SemaphoreRecord(3))
	f.Add([]byte("holder\n001795695934356:00001:statestore\nvalue"))
	f.Add([]byte(",\n"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, ok := parseEntries(b); ok {
			if again, ok := parseEntries(appendEntries(nil, got)); !ok || len(again) != len(got) {
				t.Fatalf("entries %q do not read back", b)
			}
		}
		if token, rel, got, ok := parseTurn(b); ok {
			t2, r2, again, ok := parseTurn(turnBody(token, rel, got)[1:])
			if !ok || t2 != token || r2 != rel || len(again) != len(got) {
				t.Fatalf("turn %q does not read back", b)
			}
		}
		if v, ids, ok := parseExpired(b); ok {
			v2, again, ok := parseExpired(expiredBody(v, ids)[1:])
			if !ok || v2 != v || !slices.Equal(again, ids) {
				t.Fatalf("expiry %q does not read back", b)
			}
		}
		if n, ok := parseSemaphoreRecord(b); ok {
			if n < 1 || n > maxSemaphoreLimit || !bytes.Equal(SemaphoreRecord(n), b) {
				t.Fatalf("record %q gives limit %d", b, n)
			}
		}
		_ = ParseHolder(b, ts)
		// What a FenceKey lock writes is waited for by one, and by no Lock
		// without FenceKey.
		for _, fence := range []bool{false, true} {
			if err := checkRecord(fence, b); err != nil && !errors.Is(err, ErrNotALock) {
				t.Fatalf("checkRecord(%v, %q) = %v", fence, b, err)
			}
		}
		if _, ok := fenceRecord(b); ok && (checkRecord(true, b) != nil || checkRecord(false, b) == nil) {
			t.Fatalf("the FenceKey record %q is judged wrong", b)
		}
	})
}
