// Command failover is dsslock's main demo: three candidates elect a leader
// with package leader, the leader writes through package fenced, and the
// leadership passes on in the three ways a leader stops leading.
//
//	go run ./examples/failover                  # on a local state store started in-process
//	go run ./examples/failover -svg run.svg     # also draws the run
//	go run ./examples/failover -json            # one JSON object, for scripts
//	go run ./examples/failover -addr host:1883  # on any state store; -env: the AIO_* environment
//
// Candidates A, B and C campaign on one election (TTL 1 s, -ttl). Whoever
// leads increments a shared counter in the state store every 60 ms, with a
// fenced read-modify-write (fenced.Writer.Edit, fenced with its term), and
// counts the writes the store accepted and those refused as stale. Each
// candidate has its own connection, through a fault-injecting TCP proxy
// (package faultproxy), so the demo can cut or freeze it. Then:
//
//  1. Handover. The first leader stops its work and resigns (Term.Resign):
//     the next leader is elected within milliseconds, without waiting for
//     the TTL. The demo measures from the start of Resign to the next
//     leader's Campaign returning.
//  2. Takeover. The second leader crashes right after a renewal: its
//     connection is cut and nothing reconnects, so it neither renews nor
//     releases. The next leader is elected when the key expires in the
//     store, a TTL after that last renewal, which is what the demo
//     measures.
//  3. Fencing. The third leader freezes (a stop-the-world pause; the demo
//     stops its writes and blackholes its connection). Its term ends on its
//     own clock, its renew deadline after its last renewal, before the
//     store can expire the key, so its work stops before anyone else can
//     lead. The last candidate is elected and writes. Then the frozen one
//     wakes up and tries to write with its old term: its fenced writer
//     refuses to send, and a write it had prepared, sent with the old
//     token, is refused by the state store itself.
//
// The demo prints a timeline and a summary, and checks what the packages
// promise: the counter equals the number of accepted writes (no write lost
// or applied twice, none of a stale leader's landed), no two candidates led
// at once (from Campaign returning to the term ending and the work
// returning), the stale writes were refused, the paused leader stopped
// before its lease could expire, and the terms' fencing tokens increase
// strictly. It exits with status 1 if any check fails (2 for bad flags).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK     = 0
	exitFailed = 1 // an error, or a check failed
	exitUsage  = 2
)

// options are the command line's.
type options struct {
	addr string        // state store address; empty: start a local store
	env  bool          // connect as the AIO_* environment says
	ttl  time.Duration // the election's TTL
	json bool          // print one JSON object instead of the timeline
	svg  string        // file to draw the run in
}

// run runs the demo with the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("failover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.addr, "addr", "", "state store `host:port`; empty: start a local state store in-process")
	fs.BoolVar(&o.env, "env", false, "connect as the AIO_* environment says (sskv.ConfigFromEnv)")
	fs.DurationVar(&o.ttl, "ttl", time.Second, "the election's TTL: a crashed leader is replaced this long after its last renewal")
	fs.BoolVar(&o.json, "json", false, "print one JSON object with the results instead of the timeline")
	fs.StringVar(&o.svg, "svg", "", "also draw the run as an SVG picture in `file`")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: failover [flags]\n\n"+
			"Three candidates elect a leader that writes through a fenced writer; the\n"+
			"leader resigns, then crashes, then freezes, and the demo checks that no\n"+
			"write is lost, doubled or let through from a stale leader.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "failover: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	case o.env && o.addr != "":
		fmt.Fprintln(stderr, "failover: -addr and -env exclude each other")
		return exitUsage
	case o.ttl < minTTL || o.ttl%time.Millisecond != 0:
		fmt.Fprintf(stderr, "failover: -ttl %v: want a whole number of milliseconds, at least %v\n", o.ttl, minTTL)
		return exitUsage
	}

	timeline := stdout
	if o.json {
		timeline = io.Discard
	}
	rep, err := play(ctx, o, timeline)
	if err != nil {
		fmt.Fprintln(stderr, "failover:", err)
		return exitFailed
	}
	checks := rep.check()
	failed := failures(checks)
	if o.json {
		if err := json.NewEncoder(stdout).Encode(rep.result(len(failed) == 0)); err != nil {
			fmt.Fprintln(stderr, "failover:", err)
			return exitFailed
		}
	} else {
		rep.summary(stdout, checks)
	}
	if o.svg != "" {
		if err := writeSVG(o.svg, rep); err != nil {
			fmt.Fprintln(stderr, "failover:", err)
			return exitFailed
		}
	}
	if len(failed) > 0 {
		for _, f := range failed {
			fmt.Fprintln(stderr, "failover: check failed:", f)
		}
		return exitFailed
	}
	return exitOK
}
