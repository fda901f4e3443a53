package sskv

import (
	"context"
	"errors"
	"time"
)

// Metrics are hooks for the client's metrics, to bridge to Prometheus,
// OpenTelemetry or anything else without this package depending on them
// (the module github.com/dsslock/dsslock/prometheus bridges them to
// Prometheus). Nil fields are skipped, at no cost. They are called
// synchronously on the client's goroutines: they must be fast, must not
// block, and must not call the client.
type Metrics struct {
	// ConnectionUp is called when a connection is up (CONNACK received),
	// with its number: 1 for the first, growing by one with each reconnect.
	ConnectionUp func(number uint64)
	// ConnectionDown is called when connection number is lost, with the
	// cause when the client knows it (nil otherwise).
	ConnectionDown func(number uint64, cause error)
	// ConnectFailed is called for each failed connection attempt.
	ConnectFailed func(err error)
	// Request is called when a request ends, with its verb ("GET", "SET",
	// "DEL", "VDEL", "KEYNOTIFY", "KEYNOTIFY STOP"), how long it took and
	// its outcome: one of the Outcome constants, a small fixed set fit for
	// a metric's label.
	Request func(verb string, latency time.Duration, outcome string)
	// WatchResync is called when a watch of key, re-registered after a
	// reconnect, finds that the key changed meanwhile, and its watchers get
	// a Resync event.
	WatchResync func(key string)
}

// Outcomes of a request, as Metrics.Request reports them.
const (
	OutcomeOK             = "ok"              // answered, whatever the answer (a condition not met included)
	OutcomeServiceError   = "service_error"   // the store answered with an error (*ServiceError)
	OutcomeTimeout        = "timeout"         // its context's deadline passed first
	OutcomeCanceled       = "canceled"        // its context was cancelled first
	OutcomeConnectionLost = "connection_lost" // ErrConnectionLost: outcome unknown
	OutcomeNotSent        = "not_sent"        // ErrNotSent: not executed
	OutcomeTooLarge       = "too_large"       // ErrTooLarge: not sent
	OutcomeClosed         = "closed"          // ErrClosed
	OutcomeError          = "error"           // anything else (a malformed response, a rejected PUBLISH)
)

// outcome classifies a request's error for Metrics.Request.
func outcome(err error) string {
	var se *ServiceError
	switch {
	case err == nil:
		return OutcomeOK
	case errors.As(err, &se):
		return OutcomeServiceError
	case errors.Is(err, ErrTooLarge):
		return OutcomeTooLarge
	case errors.Is(err, ErrNotSent):
		return OutcomeNotSent
	case errors.Is(err, ErrClosed):
		return OutcomeClosed
	case errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	case errors.Is(err, ErrConnectionLost):
		return OutcomeConnectionLost
	}
	return OutcomeError
}

// observeRequest reports a request of verb v that began at start and ended
// with err.
func (c *Client) observeRequest(v verb, start time.Time, err error) {
	if f := c.cfg.Metrics.Request; f != nil && v != verbRaw {
		f(v.String(), time.Since(start), outcome(err))
	}
}
