package localstore

import (
	"testing"
	"time"
)

// The answers kept go when their window has passed, oldest first, and
// beyond maxAnswers; a drained burst gives its memory back.
func TestAnswersKept(t *testing.T) {
	var a answers
	t0 := time.Unix(1000, 0)
	a.keep("c\x00x", result{payload: []byte("1")}, time.Second, t0)
	a.keep("c\x00y", result{payload: []byte("2")}, 3*time.Second, t0.Add(500*time.Millisecond))
	a.keep("c\x00x", result{payload: []byte("other")}, time.Second, t0.Add(600*time.Millisecond))
	if r, ok := a.lookup("c\x00x"); !ok || string(r.payload) != "1" {
		t.Fatalf("lookup x = %q, %v; want the first answer", r.payload, ok)
	}
	a.expire(t0.Add(time.Second))
	if _, ok := a.lookup("c\x00x"); ok {
		t.Fatal("x kept past its window")
	}
	if r, ok := a.lookup("c\x00y"); !ok || string(r.payload) != "2" {
		t.Fatalf("lookup y = %q, %v", r.payload, ok)
	}
	a.expire(t0.Add(4 * time.Second))
	if len(a.byKey) != 0 || a.head != 0 || len(a.order) != 0 {
		t.Fatalf("after every window: %d kept, head %d, order %d", len(a.byKey), a.head, len(a.order))
	}

	for i := range 5000 {
		a.keep(string(rune(i)), result{}, time.Second, t0)
	}
	a.expire(t0.Add(time.Second))
	if a.byKey != nil || a.order != nil {
		t.Fatal("a drained burst kept its memory")
	}
}

func TestAnswerWindow(t *testing.T) {
	for _, c := range []struct{ expiry, want time.Duration }{
		{0, answerWindowDefault}, {10 * time.Second, 10 * time.Second}, {time.Hour, answerWindowMax},
	} {
		if got := answerWindow(c.expiry); got != c.want {
			t.Errorf("answerWindow(%v) = %v; want %v", c.expiry, got, c.want)
		}
	}
}
