package lease

import (
	"context"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// RetryRequests calls f until it returns nil or an error final says to
// return, waiting between calls on a backoff scaled to ttl (as a waiter
// retries a failed request) and logging each failure with msg. It returns
// ctx's error if ctx ends while it waits.
func RetryRequests(ctx context.Context, ttl time.Duration, log *slog.Logger, msg string, f func() error, final func(error) bool) error {
	var retry *backoff.ExponentialBackOff
	for {
		err := f()
		if err == nil || ctx.Err() != nil || final(err) {
			return err
		}
		if retry == nil {
			retry = NewBackoff(max(ttl/100, time.Millisecond), max(ttl/4, time.Millisecond))
		}
		log.Debug(msg, "error", err)
		t := time.NewTimer(retry.NextBackOff())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// NewBackoff returns an exponential backoff from initial to maxD, with
// jitter, that never gives up.
func NewBackoff(initial, maxD time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = max(maxD, initial)
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}
