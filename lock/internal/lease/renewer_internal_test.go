package lease

import (
	"testing"
	"time"
)

// The jitter added to a renewal's interval spreads renewals out, but never
// eats the time a failed renewal needs to be retried before its deadline.
func TestRenewJitter(t *testing.T) {
	for _, c := range []struct {
		interval, deadline, want time.Duration
	}{
		{10 * time.Second / 3, 20 * time.Second / 3, time.Second / 3}, // defaults, TTL 10 s: a tenth
		{90 * time.Millisecond, 100 * time.Millisecond, 2500 * time.Microsecond},
		{time.Millisecond, 2 * time.Millisecond, 100 * time.Microsecond},
		{time.Millisecond, time.Millisecond + 1, 0},
	} {
		if got := renewJitter(c.interval, c.deadline); got != c.want {
			t.Errorf("renewJitter(%v, %v) = %v, want %v", c.interval, c.deadline, got, c.want)
		}
	}
}
