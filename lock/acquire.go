package lock

import (
	"bytes"
	"context"

	"github.com/dsslock/dsslock/sskv"
)

// Acquire waits until it holds the lock on cfg.Name, as [Lock.Lock] does,
// and returns the Lock that holds it. It is New and Lock in one call, for a
// caller that has no use for the Lock before it holds: with Config.Race, it
// keeps no Lock, and no context of its own, while it waits: only its watch
// of the key. A waiter asleep while the holder renews costs about 1.0 KB of
// heap, where New and Lock cost about 1.25 KB. Package leader's Campaign
// uses it: a client may follow thousands of elections.
//
// Without Config.HolderID, each attempt's Lock has a default HolderID of
// its own: the Lock returned has the one its acquisition wrote.
//
// Everything Lock promises holds. If ctx ends first, the store refuses an
// acquisition, or the key will never be released to it ([ErrNotALock]),
// Acquire returns an error and holds nothing: a last attempt whose outcome
// is unknown is given back in the background, as Lock does. An invalid cfg gives an error wrapping [ErrConfig]. Without
// Config.Race it is New then Lock, and costs what they cost.
func Acquire(ctx context.Context, c *sskv.Client, cfg Config) (*Lock, error) {
	if !cfg.Race {
		l, err := New(c, cfg)
		if err != nil {
			return nil, err
		}
		if err := l.Lock(ctx); err != nil {
			return nil, err
		}
		return l, nil
	}
	if c == nil {
		return nil, configErr("nil sskv.Client")
	}
	given := cfg.HolderID
	cfg, err := cfg.withDefaults(c.ID())
	if err != nil {
		return nil, err
	}
	if err := checkWatchable(c, cfg.Name, cfg.HolderID); err != nil {
		return nil, err
	}
	cfg.Value = bytes.Clone(cfg.Value) // the caller may change it while Acquire waits
	if given == "" {
		// Each attempt's Lock gets a HolderID of its own (see
		// racer.attempt): a waiter keeps none while it sleeps.
		cfg.HolderID = ""
	}
	r := racer{c: c, cfg: cfg, log: lockLogger(&cfg)}
	unknown, err := r.wait(ctx)
	if err != nil {
		if unknown {
			r.l.abandonThenEnd()
		} else if r.l != nil {
			r.l.end()
		}
		return nil, &opError{name: cfg.Name, err: err}
	}
	r.l.end()
	return r.l, nil
}
