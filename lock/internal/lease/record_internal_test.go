package lease

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// checkRecord lets through what holders of the same kind write, and only
// that: a waiter must still wait for a real lock's holder.
func TestCheckRecord(t *testing.T) {
	tok := hlc.Timestamp{Wall: 1795695934356, Counter: 1, Node: "statestore"}
	plain := New(nil, Config{Name: "l", HolderID: "me"}, slog.New(slog.DiscardHandler))
	fenced := New(nil, Config{Name: "l", HolderID: "me", FenceKey: true, Value: []byte("v\nw")}, slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		value       []byte
		plain, keys bool // a Lock without FenceKey, a FenceKey lock waits for it
	}{
		{nil, true, true}, // a free key
		{plain.record(tok, nil), true, false},
		{[]byte("sdk-holder"), true, false}, // the SDK's leased lock
		{fenced.record(tok, []byte("v\nw")), false, true},
		{fenced.AcqRecord(), false, true}, // an acquisition under way, or a reservation
		{[]byte("me\n\n"), false, true},   // no token: ParseHolder reads it as a holder
		{[]byte(SemaphoreRecordPrefix + "3"), false, false},
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
			err := CheckRecord(fence, tc.value)
			if (err == nil) != want || (err != nil && !errors.Is(err, ErrNotALock)) {
				t.Errorf("CheckRecord(FenceKey %v, %q) = %v; want a wait: %v", fence, tc.value, err, want)
			}
		}
	}
}

func TestIsReservation(t *testing.T) {
	for _, id := range []string{"a", "node-1/0123", ""} {
		if !IsReservation(Reservation(id), id) {
			t.Errorf("IsReservation(Reservation(%q)) = false", id)
		}
	}
	for _, v := range []string{"a\n~handover\nx", "a\n~handover", "ab\n~handover\n", "a\n~handoveR\n", "a\n~nonce\n", "", "a"} {
		if IsReservation([]byte(v), "a") {
			t.Errorf("IsReservation(%q, a) = true", v)
		}
	}
}

// Any value of the key is judged without a panic, and a reservation only
// if it is exactly one.
func FuzzIsReservation(f *testing.F) {
	f.Add([]byte("a\n~handover\n"), "a")
	f.Add([]byte("a\n~handover\nv"), "a")
	f.Fuzz(func(t *testing.T, v []byte, id string) {
		if got, want := IsReservation(v, id), string(v) == string(Reservation(id)); got != want {
			t.Fatalf("IsReservation(%q, %q) = %v; want %v", v, id, got, want)
		}
	})
}

// FuzzCheckRecord: what a FenceKey lock writes is waited for by one, and
// by no Lock without FenceKey; nothing panics.
func FuzzCheckRecord(f *testing.F) {
	f.Add([]byte("holder\n001795695934356:00001:statestore\nvalue"))
	f.Add([]byte(SemaphoreRecordPrefix + "3"))
	f.Add([]byte("me\n~handover\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fence := range []bool{false, true} {
			if err := CheckRecord(fence, b); err != nil && !errors.Is(err, ErrNotALock) {
				t.Fatalf("CheckRecord(%v, %q) = %v", fence, b, err)
			}
		}
		if _, ok := fenceRecord(b); ok && (CheckRecord(true, b) != nil || CheckRecord(false, b) == nil) {
			t.Fatalf("the FenceKey record %q is judged wrong", b)
		}
	})
}
