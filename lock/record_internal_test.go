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

func TestIsReservation(t *testing.T) {
	for _, id := range []string{"a", "node-1/0123", ""} {
		if !isReservation(reservation(id), id) {
			t.Errorf("isReservation(reservation(%q)) = false", id)
		}
	}
	for _, v := range []string{"a\n~handover\nx", "a\n~handover", "ab\n~handover\n", "a\n~handoveR\n", "a\n~nonce\n", "", "a"} {
		if isReservation([]byte(v), "a") {
			t.Errorf("isReservation(%q, a) = true", v)
		}
	}
}

// Any value of the key is judged without a panic, and a reservation only
// if it is exactly one.
func FuzzIsReservation(f *testing.F) {
	f.Add([]byte("a\n~handover\n"), "a")
	f.Add([]byte("a\n~handover\nv"), "a")
	f.Fuzz(func(t *testing.T, v []byte, id string) {
		if got, want := isReservation(v, id), string(v) == string(reservation(id)); got != want {
			t.Fatalf("isReservation(%q, %q) = %v; want %v", v, id, got, want)
		}
	})
}
