package localstore

import (
	"testing"
	"time"
)

// An answer is found by its request's client and correlation data until
// its window passes; the first answer to a request stands; the client's
// next request with the same packet id replaces it (the client had its
// PUBACK); sweeps forget expired answers and give a drained burst's memory
// back.
func TestAnswersKept(t *testing.T) {
	var a answers
	t0 := time.Unix(1000, 0)
	x, y := a.key("c", []byte("x")), a.key("c", []byte("y"))
	if x == y || x == a.key("cx", nil) || x == a.key("d", []byte("x")) || x != a.key("c", []byte("x")) {
		t.Fatal("keys of different requests match, or of one request differ")
	}
	s1, s2 := a.slot("c", 1), a.slot("c", 2)
	if s1 == s2 || s1 == a.slot("d", 1) {
		t.Fatal("slots of different requests match")
	}
	found := func(k answerKey, at time.Time, want string) {
		t.Helper()
		r, ok := a.lookup(k, at)
		if got := map[bool]string{true: string(r.payload), false: "none"}[ok]; got != want {
			t.Fatalf("lookup at %v = %s; want %s", at.Sub(t0), got, want)
		}
	}
	a.keep(x, s1, result{payload: []byte("1")}, time.Second, t0)
	a.keep(y, s2, result{payload: []byte("2")}, 3*time.Second, t0)
	found(x, t0.Add(999*time.Millisecond), "1")
	found(x, t0.Add(time.Second), "none")
	found(y, t0.Add(2*time.Second), "2")

	z := a.key("c", []byte("z"))
	a.keep(z, s2, result{payload: []byte("3")}, 3*time.Second, t0.Add(time.Second))
	found(y, t0.Add(time.Second), "none")
	found(z, t0.Add(time.Second), "3")

	a.sweep(t0.Add(5 * time.Second))
	if a.bySlot != nil || a.byKey != nil {
		t.Fatalf("after every window: %d and %d kept", len(a.bySlot), len(a.byKey))
	}
	for i := range 5000 {
		a.keep(a.key("c", []byte{byte(i), byte(i >> 8)}), a.slot("c", uint16(i+1)), result{}, time.Second, t0)
	}
	if n := len(a.bySlot); n != 5000 {
		t.Fatalf("%d kept; want 5000", n)
	}
	// Keeping goes on after those expired: a sweep comes within sweepEvery.
	for i := range sweepEvery {
		a.keep(a.key("d", []byte{byte(i), byte(i >> 8)}), a.slot("d", uint16(i+1)), result{}, time.Second, t0.Add(2*time.Second))
	}
	if n := len(a.bySlot); n > sweepEvery {
		t.Fatalf("%d kept; want the expired ones swept", n)
	}
}

func TestAnswerWindow(t *testing.T) {
	for _, c := range []struct{ expiry, want time.Duration }{
		{0, answerWindowDefault}, {7 * time.Second, 7 * time.Second}, {time.Hour, answerWindowMax},
	} {
		if got := answerWindow(c.expiry); got != c.want {
			t.Errorf("answerWindow(%v) = %v; want %v", c.expiry, got, c.want)
		}
	}
}
