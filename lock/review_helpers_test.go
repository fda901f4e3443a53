package lock_test

import (
	"context"
	"log/slog"
	"sync"
)

// hookHandler is a slog.Handler that calls fn, once, in the logging
// goroutine, for the first record whose message is msg and whose "lock"
// attribute (added by a Lock's logger) is key. It injects a fault at an
// exact step of an acquisition: a Lock logs "acquired" after its SETs were
// answered and before it starts renewing, in the goroutine that acquires.
type hookHandler struct {
	msg, key string
	attrs    []slog.Attr
	once     *sync.Once
	fn       func()
}

func newHook(msg, key string, fn func()) *slog.Logger {
	return slog.New(&hookHandler{msg: msg, key: key, once: new(sync.Once), fn: fn})
}

func (h *hookHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *hookHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	for _, a := range h.attrs {
		if a.Key == "lock" && a.Value.String() == h.key {
			h.once.Do(h.fn)
		}
	}
	return nil
}

func (h *hookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *hookHandler) WithGroup(string) slog.Handler { return h }
