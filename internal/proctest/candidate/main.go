// Command candidate is one candidate of the process-level safety test
// (package internal/proctest), which builds and runs it; it is for nothing
// else. It campaigns with leader.Elector on a state store and, while it
// leads, increments one counter key with fenced read-modify-writes, about
// every -pace, each read and write with its own -op-timeout deadline.
//
// It writes one JSON line per event to standard output, each with the wall
// clock in nanoseconds (field "t"), as a single write so that a kill -9
// never leaves half a line:
//
//	{"t":…,"ev":"work_start","token":"…"}   the work of a term began
//	{"t":…,"ev":"work_end","token":"…"}     it returned
//	{"t":…,"ev":"inc","token":"…","read_ns":…,"write_ns":…,"read":41,"wrote":42,"version":"…","outcome":"ok"}
//	{"t":…,"ev":"read_error","token":"…","err":"…"}
//
// An increment's read was sent at read_ns, its write at write_ns, and t is
// when the write's answer (or error) came. Its outcome is "ok" (the store
// applied it, at version), "stale" (refused by fencing: by the store, or by
// the writer before sending it) or "unknown" (a timeout or a lost
// connection: it may or may not have been applied).
//
// SIGTERM or SIGINT stops it cleanly: the work returns, the term is resigned
// and the process exits 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// The keys every candidate uses.
const (
	electionKey = "proctest/leader"
	counterKey  = "proctest/counter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		os.Exit(1)
	}
}

// run runs the candidate with the command line args until ctx ends.
func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("candidate", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:1883", "the state store's `host:port`")
	id := fs.String("id", "candidate", "this candidate's name, published while it leads")
	ttl := fs.Duration("ttl", time.Second, "the lease of a term")
	pace := fs.Duration("pace", 25*time.Millisecond, "the mean pause between two increments (each from half to 3/2 of it)")
	opTimeout := fs.Duration("op-timeout", 300*time.Millisecond, "the deadline of each read and write of the counter")
	// Hidden, for the test of the checks only: the work ignores the end of
	// its term and writes without the term's token.
	broken := fs.Bool("broken", false, "")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: candidate [flags]")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name != "broken" {
				name, usage := flag.UnquoteUsage(f)
				fmt.Fprintf(fs.Output(), "  -%s %s\n    \t%s (default %s)\n", f.Name, name, usage, f.DefValue)
			}
		})
	}
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("id", *id)
	c, err := sskv.Dial(ctx, sskv.Config{Addr: *addr, Logger: log,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 250 * time.Millisecond})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the store answered
		}
		return fmt.Errorf("dial %s: %w", *addr, err)
	}
	defer c.Close()

	e, err := leader.NewElector(c, electionKey, []byte(*id), leader.WithTTL(*ttl), leader.WithLogger(log))
	if err != nil {
		return err
	}
	out := &emitter{w: os.Stdout}
	err = e.Run(ctx, func(wctx context.Context, t *leader.Term) error {
		token := t.Token().String()
		out.emit(event{Ev: "work_start", Token: token})
		defer out.emit(event{Ev: "work_end", Token: token})
		var w setter = fenced.New(c, t)
		if *broken {
			wctx, w = ctx, c // stops with the process only, writes unfenced
		}
		work(wctx, c, w, token, *pace, *opTimeout, out)
		return nil
	})
	if ctx.Err() != nil {
		return nil // stopped, and resigned
	}
	return fmt.Errorf("elector: %w", err)
}

// setter writes the counter: a fenced.Writer, or the bare client.
type setter interface {
	Set(ctx context.Context, key string, value []byte, opts sskv.SetOptions) (sskv.SetResult, error)
}

// work increments the counter about every pace until ctx ends. The pauses
// are random, from pace/2 to 3/2 pace, so that two candidates that write at
// once (broken ones) do not keep their read-modify-writes in or out of step
// for a whole run, and faults hit every part of the cycle.
func work(ctx context.Context, c *sskv.Client, w setter, token string, pace, timeout time.Duration, out *emitter) {
	for ctx.Err() == nil {
		ev := increment(ctx, c, w, timeout)
		ev.Token = token
		out.emit(ev)
		select {
		case <-ctx.Done():
		case <-time.After(pace/2 + rand.N(pace)):
		}
	}
}

// increment reads the counter and writes it back plus one, each request
// with its own deadline, and returns the event that records it.
func increment(ctx context.Context, c *sskv.Client, w setter, timeout time.Duration) event {
	ev := event{Ev: "inc", ReadNs: time.Now().UnixNano()}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	cur, err := c.Get(rctx, counterKey)
	cancel()
	if err == nil && cur.Found {
		ev.Read, err = strconv.ParseInt(string(cur.Value), 10, 64)
	}
	if err != nil {
		return event{Ev: "read_error", Err: err.Error()}
	}
	ev.Wrote = ev.Read + 1
	ev.WriteNs = time.Now().UnixNano()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	res, err := w.Set(wctx, counterKey, strconv.AppendInt(nil, ev.Wrote, 10), sskv.SetOptions{})
	cancel()
	ev.T = time.Now().UnixNano()
	switch {
	case err == nil:
		ev.Outcome, ev.Version = "ok", res.Version.String()
	case errors.Is(err, fenced.ErrStale):
		ev.Outcome, ev.Err = "stale", err.Error()
	default:
		ev.Outcome, ev.Err = "unknown", err.Error()
	}
	return ev
}

// event is one line of standard output; see the package documentation.
type event struct {
	T       int64  `json:"t"`
	Ev      string `json:"ev"`
	Token   string `json:"token,omitempty"`
	ReadNs  int64  `json:"read_ns,omitempty"`
	WriteNs int64  `json:"write_ns,omitempty"`
	Read    int64  `json:"read,omitempty"`
	Wrote   int64  `json:"wrote,omitempty"`
	Version string `json:"version,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	Err     string `json:"err,omitempty"`
}

// emitter writes events as JSON lines, each in one write, at once.
type emitter struct {
	mu sync.Mutex
	w  io.Writer
}

// emit writes ev, stamped with the wall clock now unless it has a time.
func (o *emitter) emit(ev event) {
	if ev.T == 0 {
		ev.T = time.Now().UnixNano()
	}
	line, err := json.Marshal(ev)
	if err != nil {
		panic(err) // an event always marshals
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(append(line, '\n'))
}
