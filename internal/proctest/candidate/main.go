// Command candidate is one candidate of the process-level safety test
// (package internal/proctest), which builds and runs it; it is for nothing
// else. What it holds depends on -mode:
//
//   - election (the default): it campaigns with leader.Elector and, while it
//     leads, increments the counter key proctest/counter;
//   - semaphore: it loops over lock.Semaphore's Acquire (the semaphore
//     proctest/sem of -limit slots), a holding of random length (-hold/2 to
//     3/2 -hold) and Release; while it holds slot i, it increments the
//     counter key of the slot, proctest/sem/counter/i (tokens of different
//     slots are not ordered, so each slot fences a key of its own);
//   - group: it is a member of the leader.Group proctest/group of -elections
//     elections, proctest/group/e0 to e<n-1>, and, while it leads election
//     e, increments the counter key e + "/counter".
//
// Each increment is a fenced read-modify-write (fenced with the term or the
// semaphore's holding), about every -pace, each read and write with its own
// -op-timeout deadline.
//
// It writes one JSON line per event to standard output, each with the wall
// clock in nanoseconds (field "t"), as a single write so that a kill -9
// never leaves half a line. "res" names what the work holds: "" for the
// election, "slot i" for slot i of the semaphore, the election's key in a
// group; "key" is the counter key.
//
//	{"t":…,"ev":"work_start","res":"…","token":"…"}   a term's (a holding's) work began
//	{"t":…,"ev":"work_end","res":"…","token":"…"}     it returned
//	{"t":…,"ev":"inc","res":"…","key":"…","token":"…","read_ns":…,"write_ns":…,"read":41,"wrote":42,"version":"…","outcome":"ok"}
//	{"t":…,"ev":"read_error","res":"…","token":"…","err":"…"}
//	{"t":…,"ev":"acquire_error","err":"…"}            the semaphore's Acquire failed; tried again 100 ms later
//
// An increment's read was sent at read_ns, its write at write_ns, and t is
// when the write's answer (or error) came. Its outcome is "ok" (the store
// applied it, at version), "stale" (refused by fencing: by the store, or by
// the writer before sending it) or "unknown" (a timeout or a lost
// connection: it may or may not have been applied).
//
// SIGTERM or SIGINT stops it cleanly: the work returns, the term is resigned
// (the slot released, the group left) and the process exits 0. An error of
// the election or the group ends it with status 1.
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
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// The keys every candidate uses.
const (
	electionKey = "proctest/leader"
	counterKey  = "proctest/counter"
	semName     = "proctest/sem"
	groupName   = "proctest/group"
)

// semCounter is the counter key of slot i of the semaphore.
func semCounter(i int) string { return fmt.Sprintf("%s/counter/%d", semName, i) }

// groupElection is the key of election i of the group.
func groupElection(i int) string { return fmt.Sprintf("%s/e%d", groupName, i) }

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
	mode := fs.String("mode", "election", "what to hold: `election`, semaphore or group")
	limit := fs.Int("limit", 2, "the semaphore's limit (-mode semaphore)")
	hold := fs.Duration("hold", 200*time.Millisecond, "the mean length of a holding of the semaphore, from half to 3/2 of it (-mode semaphore)")
	elections := fs.Int("elections", 6, "the group's number of elections (-mode group)")
	debug := fs.Bool("debug", false, "log at level debug (to standard error)")
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
	if *mode != "election" && *mode != "semaphore" && *mode != "group" {
		return fmt.Errorf("-mode %q: want election, semaphore or group", *mode)
	}
	if *broken && *mode != "election" {
		return errors.New("-broken needs -mode election")
	}

	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("id", *id, "mode", *mode)
	c, err := sskv.Dial(ctx, sskv.Config{Addr: *addr, Logger: log,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 250 * time.Millisecond})
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the store answered
		}
		return fmt.Errorf("dial %s: %w", *addr, err)
	}
	defer c.Close()

	p := params{c: c, log: log, out: &emitter{w: os.Stdout}, id: *id, ttl: *ttl, pace: *pace, opTimeout: *opTimeout,
		limit: *limit, hold: *hold, elections: *elections, broken: *broken}
	switch *mode {
	case "semaphore":
		err = semaphore(ctx, p)
	case "group":
		err = group(ctx, p)
	default:
		err = election(ctx, p)
	}
	if ctx.Err() != nil {
		return nil // stopped, and resigned (released, left)
	}
	return err
}

// params is what the command line and the connection give a mode.
type params struct {
	c                    *sskv.Client
	log                  *slog.Logger
	out                  *emitter
	id                   string
	ttl, pace, opTimeout time.Duration
	limit                int           // semaphore
	hold                 time.Duration // semaphore
	elections            int           // group
	broken               bool          // election
}

// election campaigns with leader.Elector and works while it leads, until
// ctx ends.
func election(ctx context.Context, p params) error {
	c, out := p.c, p.out
	e, err := leader.NewElector(c, electionKey, []byte(p.id), leader.WithTTL(p.ttl), leader.WithLogger(p.log))
	if err != nil {
		return err
	}
	err = e.Run(ctx, func(wctx context.Context, t *leader.Term) error {
		token := t.Token().String()
		out.emit(event{Ev: "work_start", Token: token})
		defer out.emit(event{Ev: "work_end", Token: token})
		var w setter = fenced.New(c, t)
		if p.broken {
			wctx, w = ctx, c // stops with the process only, writes unfenced
		}
		work(wctx, p, w, "", counterKey, token)
		return nil
	})
	return fmt.Errorf("elector: %w", err)
}

// semaphore acquires the semaphore, works for a holding of random length
// (hold/2 to 3/2 hold, or until the holding is lost) and releases it, over
// and over until ctx ends.
func semaphore(ctx context.Context, p params) error {
	c, out := p.c, p.out
	s, err := lock.NewSemaphore(c, lock.SemaphoreConfig{Name: semName, Limit: p.limit, HolderID: p.id, TTL: p.ttl, Logger: p.log})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = s.Close(cctx)
	}()
	w := fenced.New(c, s)
	for ctx.Err() == nil {
		if err := s.Acquire(ctx); err != nil {
			if ctx.Err() != nil || errors.Is(err, lock.ErrClosed) || errors.Is(err, sskv.ErrClosed) {
				return fmt.Errorf("semaphore: acquire: %w", err)
			}
			// Acquire retries what a Lock's Lock retries (timeouts, lost
			// connections): any other error is logged for the test to
			// report, and the loop goes on, so that the run's checks see
			// the rest of it.
			out.emit(event{Ev: "acquire_error", Err: err.Error()})
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		slot, token := s.Slot(), s.Token().String()
		res := fmt.Sprintf("slot %d", slot)
		out.emit(event{Ev: "work_start", Res: res, Token: token})
		wctx, cancel := context.WithTimeout(s.Context(), p.hold/2+rand.N(p.hold))
		work(wctx, p, w, res, semCounter(slot), token)
		cancel()
		out.emit(event{Ev: "work_end", Res: res, Token: token})
		// Not ctx: a stopping candidate releases too.
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := s.Release(rctx); err != nil {
			p.log.Info("release", "slot", slot, "err", err)
		}
		cancel()
	}
	return nil
}

// group runs a member of the group, working in each election it leads,
// until ctx ends.
func group(ctx context.Context, p params) error {
	c, out := p.c, p.out
	elections := make([]string, p.elections)
	for i := range elections {
		elections[i] = groupElection(i)
	}
	g, err := leader.NewGroup(c, groupName, elections, []byte(p.id),
		leader.WithTTL(p.ttl), leader.WithCandidateID(p.id), leader.WithLogger(p.log))
	if err != nil {
		return err
	}
	err = g.Run(ctx, func(wctx context.Context, t *leader.Term) error {
		res, token := t.Election(), t.Token().String()
		out.emit(event{Ev: "work_start", Res: res, Token: token})
		defer out.emit(event{Ev: "work_end", Res: res, Token: token})
		work(wctx, p, fenced.New(c, t), res, res+"/counter", token)
		return nil
	})
	return fmt.Errorf("group: %w", err)
}

// setter writes the counter: a fenced.Writer, or the bare client.
type setter interface {
	Set(ctx context.Context, key string, value []byte, opts sskv.SetOptions) (sskv.SetResult, error)
}

// work increments the counter key through w, logging each increment as one
// of res under token, about every pace until ctx ends. The pauses
// are random, from pace/2 to 3/2 pace, so that two candidates that write at
// once (broken ones) do not keep their read-modify-writes in or out of step
// for a whole run, and faults hit every part of the cycle.
func work(ctx context.Context, p params, w setter, res, key, token string) {
	for ctx.Err() == nil {
		ev := increment(ctx, p.c, w, key, p.opTimeout)
		ev.Res, ev.Token = res, token
		p.out.emit(ev)
		select {
		case <-ctx.Done():
		case <-time.After(p.pace/2 + rand.N(p.pace)):
		}
	}
}

// increment reads the counter key and writes it back plus one, each request
// with its own deadline, and returns the event that records it.
func increment(ctx context.Context, c *sskv.Client, w setter, key string, timeout time.Duration) event {
	ev := event{Ev: "inc", Key: key, ReadNs: time.Now().UnixNano()}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	cur, err := c.Get(rctx, key)
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
	res, err := w.Set(wctx, key, strconv.AppendInt(nil, ev.Wrote, 10), sskv.SetOptions{})
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
	Res     string `json:"res,omitempty"`
	Key     string `json:"key,omitempty"`
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
