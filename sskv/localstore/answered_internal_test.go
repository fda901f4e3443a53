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
	k := func(client, corr, payload, ts string) answerKey {
		return a.key(client, []byte(corr), []byte(payload), ts)
	}
	x, y := k("c", "x", "SET", "1"), k("c", "y", "SET", "1")
	for _, other := range []answerKey{y, k("cx", "", "SET", "1"), k("d", "x", "SET", "1"), k("c", "x", "DEL", "1"), k("c", "x", "SET", "2"), k("c", "xS", "ET", "1")} {
		if other == x {
			t.Fatal("keys of different requests match")
		}
	}
	if x != k("c", "x", "SET", "1") {
		t.Fatal("keys of one request differ")
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

	z := k("c", "z", "SET", "1")
	a.keep(z, s2, result{payload: []byte("3")}, 3*time.Second, t0.Add(time.Second))
	found(y, t0.Add(time.Second), "none")
	found(z, t0.Add(time.Second), "3")

	a.sweep(t0.Add(5 * time.Second))
	if a.bySlot != nil || a.byKey != nil {
		t.Fatalf("after every window: %d and %d kept", len(a.bySlot), len(a.byKey))
	}
	for i := range 5000 {
		a.keep(k("c", string([]byte{byte(i), byte(i >> 8)}), "", ""), a.slot("c", uint16(i+1)), result{}, time.Second, t0)
	}
	if n := len(a.bySlot); n != 5000 {
		t.Fatalf("%d kept; want 5000", n)
	}
	// Keeping goes on after those expired: a sweep comes within sweepEvery.
	for i := range sweepEvery {
		a.keep(k("d", string([]byte{byte(i), byte(i >> 8)}), "", ""), a.slot("d", uint16(i+1)), result{}, time.Second, t0.Add(2*time.Second))
	}
	if n := len(a.bySlot); n > sweepEvery {
		t.Fatalf("%d kept; want the expired ones swept", n)
	}
}

// A full cache keeps no more answers until a sweep makes room, and sweeps
// no more often than when it is not full (it once swept on every request,
// under the store's lock). A sweep that empties it is followed by a keep
// (that once wrote to the maps the sweep had dropped: a panic).
func TestAnswersFull(t *testing.T) {
	a := answers{limit: 100}
	t0 := time.Unix(1000, 0)
	keep := func(i int, at time.Time) answerKey {
		k := a.key("c", []byte{byte(i), byte(i >> 8)}, nil, "")
		a.keep(k, a.slot("c", uint16(i+1)), result{payload: []byte("1")}, time.Second, at)
		return k
	}
	for i := range 100 {
		keep(i, t0)
	}
	sweeps := 0
	for i := 100; i < 100+sweepEvery-100-1; i++ {
		if k := keep(i, t0.Add(2*time.Second)); a.kept == 0 {
			sweeps++
		} else if _, ok := a.lookup(k, t0.Add(2*time.Second)); ok {
			t.Fatalf("answer %d kept in a full cache", i)
		}
	}
	if sweeps != 0 || len(a.bySlot) != 100 {
		t.Fatalf("%d sweeps, %d kept before sweepEvery requests; want none, and the 100", sweeps, len(a.bySlot))
	}
	k := keep(sweepEvery, t0.Add(2*time.Second)) // the sweep is due: the expired 100 go
	if _, ok := a.lookup(k, t0.Add(2*time.Second)); !ok || len(a.bySlot) != 1 {
		t.Fatalf("after the sweep: %d kept, the new answer found %v; want it alone", len(a.bySlot), ok)
	}
}

func TestAnswerWindow(t *testing.T) {
	for _, c := range []struct{ expiry, want time.Duration }{
		{0, answerWindowMin}, {7 * time.Second, answerWindowMin}, {2 * time.Minute, 2 * time.Minute}, {time.Hour, answerWindowMax},
	} {
		if got := answerWindow(c.expiry); got != c.want {
			t.Errorf("answerWindow(%v) = %v; want %v", c.expiry, got, c.want)
		}
	}
}
