package sskv

import (
	"context"
	"errors"
	"time"

	"github.com/dsslock/dsslock/sskv/internal/resp"
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
	// a metric's label. The outcomes tell apart what a user alerts on:
	// OutcomeRefused is the store declining a write because of the key's
	// state, which contention for a lock or an election does all the time
	// (a follower's campaign, a resign after a new leader took the key);
	// OutcomeServiceError is a refusal no healthy client meets (a clock
	// ahead of the store's, a quota, a missing authorization);
	// OutcomeTimeout and OutcomeCanceled are the caller giving up;
	// OutcomeConnectionLost and OutcomeNotSent are a connection lost.
	Request func(verb string, latency time.Duration, outcome string)
	// WatchResync is called when a watch of key, re-registered after a
	// reconnect, finds that the key changed meanwhile, and its watchers get
	// a Resync event.
	WatchResync func(key string)
}

// Outcomes of a request, as Metrics.Request reports them. OutcomeOK and
// OutcomeRefused are answers of a healthy store to a healthy client; the
// others are errors of the store, the client, the connection or the
// caller's context.
const (
	// OutcomeOK: the store did what was asked. A GET of a missing key, and
	// a DEL or VDEL of a missing key, are OK.
	OutcomeOK = "ok"
	// OutcomeRefused: the store declined because of the key's state, as
	// contention for a lock does: a SET whose Condition was not met
	// (Applied false), a VDEL of another value (Mismatch true), or a write
	// of a key fenced by another holder (ErrFencingTokenRequired,
	// ErrFencingTokenLower). Nothing was written; it is not an error.
	OutcomeRefused = "refused"
	// OutcomeServiceError: the store answered with any other error (a
	// *ServiceError: ErrTimestampSkew, ErrFencingTokenSkew,
	// ErrQuotaExceeded, ErrNotAuthorized, an unknown message, ...).
	OutcomeServiceError = "service_error"
	// OutcomeTimeout: the request's context's deadline (or
	// Config.RequestTimeout) passed before its answer came.
	OutcomeTimeout = "timeout"
	// OutcomeCanceled: the request's context was cancelled first.
	OutcomeCanceled = "canceled"
	// OutcomeConnectionLost: ErrConnectionLost, the connection was lost
	// with the request in flight; its outcome is unknown.
	OutcomeConnectionLost = "connection_lost"
	// OutcomeNotSent: ErrNotSent, the request's connection (a Conn) was
	// lost before it went out; it was not executed.
	OutcomeNotSent = "not_sent"
	// OutcomeTooLarge: ErrTooLarge, larger than the broker accepts; not sent.
	OutcomeTooLarge = "too_large"
	// OutcomeClosed: ErrClosed, the Client was closed.
	OutcomeClosed = "closed"
	// OutcomeError: anything else (a malformed response, a PUBLISH the
	// broker rejected, an invalid option).
	OutcomeError = "error"
)

// outcome classifies a request of verb v that ended with reply r and err,
// for Metrics.Request. It goes by the parsed reply and the error's kind
// (errors.Is), never by an error's text.
func outcome(v verb, r reply, err error) string {
	var se *ServiceError
	switch {
	case err == nil:
		if declined(v, r) {
			return OutcomeRefused
		}
		return OutcomeOK
	case errors.Is(err, ErrFencingTokenRequired), errors.Is(err, ErrFencingTokenLower):
		return OutcomeRefused
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

// declined reports whether r answers v with "not done": a SET whose
// condition was not met, or a VDEL of another value (both ":-1").
func declined(v verb, r reply) bool {
	return (v == verbSet || v == verbVDel) && r.Kind == resp.KindInt && r.Int == -1
}

// observeRequest reports a request of verb v that began at start and ended
// with r and err.
func (c *Client) observeRequest(v verb, start time.Time, r reply, err error) {
	if f := c.cfg.Metrics.Request; f != nil && v != verbRaw {
		f(v.String(), time.Since(start), outcome(v, r, err))
	}
}
