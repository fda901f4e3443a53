package lock

import (
	"bytes"
	"context"

	"github.com/dsslock/dsslock/lock/internal/lease"
	"github.com/dsslock/dsslock/lock/internal/wait"
	"github.com/dsslock/dsslock/sskv"
)

// Acquire is [New] and [Lock.Lock] in one call, with their promises and
// errors; with Config.Race it keeps no Lock while it waits (about 1.0 KB per
// waiter, against 1.25 KB). Without Config.HolderID, the Lock returned has
// the default HolderID its acquisition wrote.
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
	ls, err := wait.Race(ctx, c, lease.Config(cfg))
	if err != nil {
		return nil, err
	}
	return lockOf(ls), nil
}
