package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// electCommand is "sskv elect", as "etcdctl elect": a candidate, or with
// -l an observer, of an election of package leader.
var electCommand = &command{
	name:    "elect",
	args:    "[-ttl DURATION] [-priority N] NAME PROPOSAL | -l NAME",
	summary: "campaign to lead the election NAME, or (-l) print who leads it",
	doc: `Campaigns in the election NAME (a key of the state store, held with package
github.com/dsslock/dsslock/leader), publishing PROPOSAL, and once elected
prints

	leader PROPOSAL TOKEN

TOKEN being the term's fencing token as the store writes it (sskv set -ft
TOKEN makes writes that the store refuses once a later leader has written
the same keys). It then leads until SIGINT (Ctrl-C) or SIGTERM, resigns (so
another candidate takes over at once) and exits 0. Interrupted while still
campaigning, it exits 1. If leadership is lost (no renewal succeeded within
two thirds of the TTL, or a newer term took the key), it prints the reason
on stderr and exits with status 4.

With -priority N (0 or more), the candidate takes part in the priority
protocol of package leader: while it waits, it asks a leader of a lower
priority to hand over, and the leader then resigns to it at once (no TTL
wait, nobody in between). A leader with -priority that is asked by a
candidate of a higher priority resigns to it, prints

	sskv: elect NAME: handed over: ...

on stderr and exits 0. Candidates without -priority take no part.

With -l, prints who leads NAME now, then one line for each change, until
SIGINT or SIGTERM:

	leader PROPOSAL TOKEN [(resync)]
	none [(resync)]

"none" means nobody leads. "(resync)" marks a line that sums up changes not
seen one by one (during a reconnect). PROPOSAL is quoted, Go-style, when it
is not printable UTF-8 or holds a space.`,
	flags: func(fs *flag.FlagSet, o *cmdOpts) {
		durationFlag(fs, &o.ttl, "ttl", lock.DefaultTTL, "the lease `DURATION` (whole milliseconds): a leader that stops renewing is replaced this long after its last renewal")
		fs.BoolVar(&o.listen, "l", false, "observe: print the leader now and at each change (NAME only)")
		fs.IntVar(&o.prio, "priority", 0, "take part in the priority protocol with priority `N` (0 or more; higher wins): a leader of a lower priority hands over")
	},
	minArgs: 1, maxArgs: 2,
	check: checkElect,
}

// checkElect checks the arguments of elect, before connecting.
func checkElect(o *cmdOpts, pos []string) error {
	switch {
	case pos[0] == "":
		return usagef("NAME must not be empty")
	case o.listen && len(pos) > 1:
		return usagef("-l observes: give NAME only, not a PROPOSAL")
	case o.listen && o.given["ttl"]:
		return usagef("-ttl is for a candidate: -l only observes")
	case o.listen && o.given["priority"]:
		return usagef("-priority is for a candidate: -l only observes")
	case o.prio < 0:
		return usagef("-priority %d: must be 0 or more", o.prio)
	case !o.listen && len(pos) < 2:
		return usagef("missing PROPOSAL (want NAME PROPOSAL, or -l NAME to observe)")
	case !o.listen:
		return checkTTL(o.ttl)
	}
	return nil
}

// elect campaigns in the election name with proposal, leads until ctx ends
// or leadership is lost or handed over, and returns the exit status. prio,
// unless negative, is the candidate's priority (leader.WithPriority). log,
// if not nil, receives the election's own logs.
func elect(ctx context.Context, c *sskv.Client, name string, proposal []byte, ttl time.Duration, prio int, log *slog.Logger, stdout, stderr io.Writer) int {
	opts := []leader.Option{leader.WithTTL(ttl)}
	if prio >= 0 {
		opts = append(opts, leader.WithPriority(prio))
	}
	if log != nil {
		opts = append(opts, leader.WithLogger(log))
	}
	// NewElector sends nothing: it checks the options as Campaign would (the
	// renew interval and deadline that -ttl implies), before any output.
	if _, err := leader.NewElector(c, name, proposal, opts...); err != nil {
		if errors.Is(err, leader.ErrConfig) {
			return fail(stderr, usagef("elect: -ttl %v: %v", ttl, err))
		}
		return fail(stderr, err)
	}
	fmt.Fprintf(stderr, "campaigning in %s (Ctrl-C to stop)\n", showValue([]byte(name), true))
	t, err := leader.Campaign(ctx, c, name, proposal, opts...)
	switch {
	case err != nil && ctx.Err() != nil:
		fmt.Fprintf(stderr, "sskv: elect %q: interrupted while campaigning\n", name)
		return exitError
	case err != nil:
		return fail(stderr, err)
	}

	_, werr := fmt.Fprintf(stdout, "leader %s %s\n", showValue(proposal, true), t.Token())
	if werr == nil {
		select {
		case <-ctx.Done():
		case <-t.Context().Done(): // the term's end, or a request to hand over (-priority)
		}
	}
	lost := t.Err() // nil unless the term ended before this resigns
	if lost != nil {
		reason := strings.TrimPrefix(lost.Error(), "lock: lost: ")
		fmt.Fprintf(stderr, "sskv: elect %q: leadership lost: %s\n", name, reason)
	} else if cause := context.Cause(t.Context()); errors.Is(cause, leader.ErrTransferred) {
		// The Resign below hands the term over.
		fmt.Fprintf(stderr, "sskv: elect %q: handed over: %s\n", name, strings.TrimPrefix(cause.Error(), "leader: "))
	}
	// A lost term still deletes the key if it is still its own, so that the
	// next leader need not wait for the TTL; after the TTL, the key has
	// expired anyway.
	rctx, cancel := context.WithTimeout(context.Background(), min(ttl, releaseTimeout))
	defer cancel()
	if err := t.Resign(rctx); err != nil {
		fmt.Fprintf(stderr, "sskv: %s (the key expires within %v)\n", strings.TrimPrefix(err.Error(), "sskv: "), ttl)
	}
	switch {
	case lost != nil:
		return exitLost
	case werr != nil:
		return fail(stderr, werr)
	}
	return exitOK
}

// observeElection prints the leadership of the election name, then each
// change, until ctx ends, and returns the exit status.
func observeElection(ctx context.Context, c *sskv.Client, name string, stdout, stderr io.Writer) int {
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	states, err := leader.Observe(octx, c, name)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK // interrupted while starting
		}
		return fail(stderr, err)
	}
	fmt.Fprintf(stderr, "observing %s (Ctrl-C to stop)\n", showValue([]byte(name), true))
	for s := range states {
		if _, err := io.WriteString(stdout, stateLine(s)); err != nil {
			cancel()
			for range states { // until Observe has stopped
			}
			return fail(stderr, err)
		}
	}
	if ctx.Err() != nil {
		return exitOK
	}
	return fail(stderr, fmt.Errorf("elect %q: the observation ended: the connection was closed", name))
}

// stateLine is the line "sskv elect -l" prints for s.
func stateLine(s leader.State) string {
	line := "none"
	if s.HasLeader() {
		line = "leader " + showValue(s.Value, true) + " " + s.Token.String()
	}
	if s.Resync {
		line += " (resync)"
	}
	return line + "\n"
}
