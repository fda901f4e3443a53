//go:build unix

package proctest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"time"
)

// action is one planned fault.
type action struct {
	at     time.Duration // after the fault phase began
	kind   string        // store-restart, store-pause, pause, kill
	slot   int           // the candidate slot of pause and kill
	length time.Duration // the store's down time, the pause, or the delay before a new candidate
}

// uniform draws a duration in [lo, hi).
func uniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// plan draws the faults of a run from rng: a timeline for the store and one
// for each candidate slot, so that no target has two faults at once while
// the targets' faults overlap freely.
func plan(cfg config, rng *rand.Rand) [][]action {
	var store []action
	for at := uniform(rng, 500*time.Millisecond, 3*time.Second); at < cfg.faultTime; {
		a := action{at: at, kind: "store-pause", length: uniform(rng, 200*time.Millisecond, 2*time.Second)}
		if cfg.restarts && (!cfg.storePauses || rng.Float64() < 0.6) {
			a.kind, a.length = "store-restart", uniform(rng, 100*time.Millisecond, 2500*time.Millisecond)
		}
		if cfg.persist { // down for less than a holder has left to renew
			a.kind, a.length = "store-restart", uniform(rng, 100*time.Millisecond, 500*time.Millisecond)
		}
		if a.kind == "store-restart" || cfg.storePauses {
			store = append(store, a)
		}
		gap := uniform(rng, 500*time.Millisecond, 3*time.Second)
		if cfg.persist { // at least 20 restarts in 30 s
			gap = uniform(rng, 500*time.Millisecond, time.Second)
		}
		at += a.length + gap
	}
	timelines := [][]action{store}
	for slot := range cfg.nprocs() {
		var acts []action
		for at := uniform(rng, time.Second, 6*time.Second); at < cfg.faultTime && cfg.candidateFaults; {
			a := action{at: at, kind: "pause", slot: slot, length: uniform(rng, 200*time.Millisecond, 2*time.Second)}
			if rng.Float64() < 0.4 {
				a.kind, a.length = "kill", uniform(rng, 100*time.Millisecond, 2*time.Second)
			}
			acts = append(acts, a)
			at += a.length + uniform(rng, time.Second, 6*time.Second)
		}
		timelines = append(timelines, acts)
	}
	return timelines
}

// inject runs the planned timelines from start until ctx ends, and then
// heals what is still faulty: a fault in progress is cut short. It returns
// once every target is healed.
func (r *run) inject(ctx context.Context, start time.Time, timelines [][]action) error {
	errs := make([]error, len(timelines))
	var wg sync.WaitGroup
	for i, acts := range timelines {
		wg.Go(func() {
			for _, a := range acts {
				if !wait(ctx, time.Until(start.Add(a.at))) {
					return
				}
				if err := r.do(ctx, a); err != nil {
					errs[i] = fmt.Errorf("%s at %v: %w", a.kind, a.at, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// wait waits d, and reports false if ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// do injects one fault and heals it after a.length, or at once when ctx
// ends, and records it.
func (r *run) do(ctx context.Context, a action) error {
	switch a.kind {
	case "store-restart":
		p := r.store()
		from, err := p.kill()
		if err != nil {
			return err
		}
		wait(ctx, a.length)
		// Not ctx: the store must be up again whatever happens.
		if _, err := r.startStore(context.Background()); err != nil {
			return err
		}
		r.addFault(fault{Kind: a.kind, Target: p.name, From: from, To: now()})
	case "store-pause":
		return r.pause(ctx, r.store(), a, nil)
	case "pause":
		r.mu.Lock()
		c := r.slots[a.slot]
		r.mu.Unlock()
		return r.pause(ctx, c.proc, a, c)
	case "kill":
		r.mu.Lock()
		c := r.slots[a.slot]
		r.mu.Unlock()
		from, err := c.kill()
		if err != nil {
			return err
		}
		r.mu.Lock()
		c.killed = from
		r.mu.Unlock()
		wait(ctx, a.length)
		if err := r.startCandidate(a.slot); err != nil {
			return err
		}
		r.addFault(fault{Kind: a.kind, Target: c.name, From: from, To: now()})
	default:
		return fmt.Errorf("unknown fault %q", a.kind)
	}
	return nil
}

// pause stops p with SIGSTOP for a.length and continues it; c, if p is a
// candidate, records the pause.
func (r *run) pause(ctx context.Context, p *proc, a action, c *candidate) error {
	// The span covers the pause: from before SIGSTOP to after SIGCONT.
	from := now()
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	wait(ctx, a.length)
	err := p.signal(syscall.SIGCONT)
	to := now()
	r.addFault(fault{Kind: a.kind, Target: p.name, From: from, To: to})
	if c != nil {
		r.mu.Lock()
		c.pauses = append(c.pauses, span{from, to})
		r.mu.Unlock()
	}
	return err
}
