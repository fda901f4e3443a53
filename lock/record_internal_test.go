package lock

import (
	"errors"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// checkRecord lets through what holders of the same kind write, and only
// that: a waiter must still wait for a real lock's holder.
func TestCheckRecord(t *testing.T) {
	tok := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	plain := newLock(nil, Config{Name: "l", HolderID: "me"}, discardLogger)
	fenced := newLock(nil, Config{Name: "l", HolderID: "me", FenceKey: true, Value: []byte("v\nw")}, discardLogger)
	for _, tc := range []struct {
		value       []byte
		plain, keys bool // a Lock without FenceKey, a FenceKey lock waits for it
	}{
		{nil, true, true}, // a free key
		{plain.record(tok, nil), true, false},
		{[]byte("sdk-holder"), true, false}, // the SDK's leased lock
		{fenced.record(tok, []byte("v\nw")), false, true},
		{fenced.acqRecord(), false, true}, // an acquisition under way, or a reservation
		{[]byte("me\n\n"), false, true},   // no token: ParseHolder reads it as a holder
		{SemaphoreRecord(3), false, false},
		{[]byte("dsslock-semaphore limit=x"), false, false},
		{[]byte("dsslock-semaphore limit=\n~\n"), false, true}, // a HolderID, however odd
		{[]byte(""), false, false},
		{[]byte("a\nb"), false, false},
		{[]byte("a\nnot a token\nv"), false, false},
	} {
		for _, fence := range []bool{false, true} {
			want := tc.plain
			if fence {
				want = tc.keys
			}
			err := checkRecord(fence, tc.value)
			if (err == nil) != want || (err != nil && !errors.Is(err, ErrNotALock)) {
				t.Errorf("checkRecord(FenceKey %v, %q) = %v; want a wait: %v", fence, tc.value, err, want)
			}
		}
	}
}
