package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Elector runs a candidate's work whenever it leads, in the spirit of
// client-go's LeaderElector: campaign, run the work with the term's
// context, stop it when leadership is lost, give the term up once the work
// has returned, and campaign again. Create it with [NewElector]; it also
// serves a health check ([Elector.Check], [Elector.ServeHTTP]).
type Elector struct {
	c        *sskv.Client
	election string
	value    []byte
	o        options
	ttl      time.Duration // validated, default filled in
	log      *slog.Logger

	mu        sync.Mutex
	term      *Term // while the work of a term runs
	resigning *Term // after its work returned, while Run resigns it
	runs      bool
	handing   *handing // a Transfer waiting for Run to hand the term over
}

// handing is the outcome of a handover, which Transfer waits for.
type handing struct {
	done chan struct{}
	err  error
}

// NewElector returns an Elector for a candidate of election that publishes
// value. It sends nothing until Run. Invalid options give an error
// wrapping ErrConfig.
func NewElector(c *sskv.Client, election string, value []byte, opts ...Option) (*Elector, error) {
	o := newOptions(opts)
	if c == nil {
		return nil, &electionError{election, "elector", fmt.Errorf("%w: nil sskv.Client", ErrConfig)}
	}
	if o.prioritySet {
		if err := checkPriority(c, election, &o); err != nil {
			return nil, &electionError{election, "elector", err}
		}
	}
	if o.prioritySet && o.candidateID == "" {
		o.candidateID = c.ID() + "/" + randHex(8) // the same for all its campaigns
	}
	// Validate the options as a term's lock would.
	l, err := lock.New(c, o.lockConfig(election, value))
	if err != nil {
		return nil, &electionError{election, "elector", err}
	}
	cfg := l.Config()
	if o.healthTolerance <= 0 {
		o.healthTolerance = cfg.TTL - cfg.RenewDeadline
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	o.endTime = true // for Check
	return &Elector{c: c, election: election, value: value, o: o, ttl: cfg.TTL, log: o.logger.With("election", election)}, nil
}

// Run campaigns and runs work while this candidate leads, until ctx ends,
// work returns while still leading, or a campaign fails (the store refused
// it: see [Campaign]); it then returns the campaign's error.
//
// work gets a context that ends when the term ends or ctx does, and the
// term (for its token, fenced writers and Proclaim). When the term is
// lost, Run waits for work to return, resigns (which deletes the key if it
// is still this term's), and campaigns again. When ctx ends, Run waits for
// work to return, resigns, and returns ctx's error. When work returns while
// the term lasts, Run resigns and returns work's error (nil included): the
// candidate has finished. A term to be handed over ([Elector.Transfer],
// [WithPriority]) ends the work's context with cause [ErrTransferred];
// once work has returned, Run hands the term over and campaigns again,
// whatever work returned. The key is never released while work runs, so
// two works never run at once, in this process or across candidates
// (within the lease's guarantees; see the package doc).
//
// Run may be called again after it returned, but not concurrently.
func (e *Elector) Run(ctx context.Context, work func(ctx context.Context, t *Term) error) error {
	if work == nil {
		return &electionError{e.election, "run", fmt.Errorf("%w: nil work", ErrConfig)}
	}
	e.mu.Lock()
	if e.runs {
		e.mu.Unlock()
		return &electionError{e.election, "run", errors.New("Run is already running")}
	}
	e.runs = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.runs = false
		e.mu.Unlock()
	}()

	var observed sync.WaitGroup
	defer observed.Wait()
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	if e.o.onNewLeader != nil || e.o.metrics.Leaderless != nil {
		states, err := Observe(octx, e.c, e.election)
		if err != nil {
			return &electionError{e.election, "run", err}
		}
		observed.Go(func() { e.observe(states) })
	}

	for {
		t, err := campaign(ctx, e.c, e.election, e.value, &e.o)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		// The term first: whoever reads the log line and then asks
		// Leading must see it.
		e.setTerm(t)
		e.log.Info("elected", "candidate", t.CandidateID(), "token", t.Token())
		if e.o.onStarted != nil {
			e.o.onStarted(t)
		}

		wctx, cancel := context.WithCancelCause(t.Context())
		t.xfer.onRequest(cancel) // Transfer ends the work too
		stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
		werr := work(wctx, t)
		stop()
		cancel(nil)
		lost := t.Err() // nil if the term lasted until work returned

		// The work has returned: nothing acts as leader any more, whatever
		// the resign below waits for. Now the key may go.
		e.mu.Lock()
		e.term, e.resigning = nil, t
		hd := e.handing
		e.handing = nil
		// A term asked to hand over goes to that candidate (see Term.Resign).
		// Read with e.mu, as Transfer asks: a Transfer that got the term
		// asked before this.
		to := t.xfer.target()
		e.mu.Unlock()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), e.ttl)
		err, notHanded := t.giveUp(rctx, to)
		rcancel()
		switch {
		case err != nil:
			e.log.Warn("could not resign; the term's key expires after the TTL", "error", err)
		case notHanded != nil:
			e.log.Warn("could not hand the term over; resigned", "to", to, "error", notHanded)
		case to != "":
			e.log.Info("handed over", "to", to, "token", t.Token())
		}
		if hd != nil {
			hd.err = err
			if hd.err == nil {
				hd.err = notHanded
			}
			if hd.err != nil {
				hd.err = &electionError{e.election, "transfer", hd.err}
			}
			close(hd.done)
		}
		e.mu.Lock()
		e.resigning = nil
		e.mu.Unlock()
		if e.o.onStopped != nil {
			e.o.onStopped(t.Err())
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case lost != nil:
			e.log.Warn("leadership lost; campaigning again", "token", t.Token(), "reason", lost)
		case to != "":
			// Handed over: this candidate campaigns again, behind the one
			// it handed over to.
		default:
			return werr
		}
	}
}

// Transfer hands leadership over to the candidate whose id is candidateID
// (see [Term.Transfer]): it ends the work's context (cause
// [ErrTransferred]), and Run, once the work has returned, hands the term
// to that candidate in place of a resign, then campaigns again. Transfer
// returns once that is done, or ctx ends first. It returns an error
// wrapping [ErrNotLeading] if this Elector does not lead, and Term.Transfer's
// error if the term could not be handed over. Once a term is to go to a
// candidate (an earlier Transfer, or one of a higher priority), a
// Transfer to another fails.
func (e *Elector) Transfer(ctx context.Context, candidateID string) error {
	e.mu.Lock()
	t := e.term
	if t == nil || t.Err() != nil {
		e.mu.Unlock()
		return &electionError{e.election, "transfer", ErrNotLeading}
	}
	if candidateID == "" || candidateID == t.CandidateID() || strings.Contains(candidateID, "\n") {
		e.mu.Unlock()
		return &electionError{e.election, "transfer", fmt.Errorf("%w: invalid candidate id %q", ErrConfig, candidateID)}
	}
	if to := t.xfer.request(candidateID); to != candidateID {
		e.mu.Unlock()
		return &electionError{e.election, "transfer", fmt.Errorf("the term is being handed over to %q already", to)}
	}
	if e.handing == nil {
		e.handing = &handing{done: make(chan struct{})}
	}
	hd := e.handing
	e.mu.Unlock()
	select {
	case <-hd.done:
		return hd.err
	case <-ctx.Done():
		return &electionError{e.election, "transfer", ctx.Err()}
	}
}

func (e *Elector) setTerm(t *Term) {
	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
}

// observe reports the election's changes to the OnNewLeader callback and
// the Leaderless metric.
func (e *Elector) observe(states <-chan State) {
	var since time.Time // when this Elector last saw nobody leading
	for s := range states {
		switch {
		case !s.HasLeader() && since.IsZero():
			since = time.Now()
		case s.HasLeader() && !since.IsZero():
			if e.o.metrics.Leaderless != nil {
				e.o.metrics.Leaderless(time.Since(since))
			}
			since = time.Time{}
		}
		if e.o.onNewLeader != nil {
			e.o.onNewLeader(s)
		}
	}
}

// Term returns the term whose work runs now, or nil.
func (e *Elector) Term() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// Leading reports whether this candidate leads now: its work runs and its
// term has not ended.
func (e *Elector) Leading() bool {
	t := e.Term()
	if t == nil {
		return false
	}
	_, err := t.FencingToken()
	return err == nil
}

// Check is a health check, as client-go's HealthzAdaptor: it returns an
// error when this process acts as leader without being one, that is, when
// the work of a term still runs longer than the health tolerance after the
// term ended (its renewals stopped succeeding, or it was lost otherwise).
// Not leading is healthy, and so is a term whose work has returned while
// Run still resigns it: nothing acts as leader then, and a resign that
// waits for an unreachable store is no reason to restart the process (the
// key expires by itself within the TTL).
func (e *Elector) Check() error {
	t := e.Term()
	if t == nil {
		return nil
	}
	if _, err := t.FencingToken(); err == nil {
		return nil
	}
	if since := time.Since(t.endedAt()); !t.endedAt().IsZero() && since > e.o.healthTolerance {
		return fmt.Errorf("leader %q: the term ended %v ago (%v) and its work has not returned", e.election, since.Round(time.Millisecond), t.Err())
	}
	return nil
}

// ServeHTTP serves Check: 200 and "ok", or 503 and the error. While Run
// resigns a term whose work has returned, the 200's text says so.
func (e *Elector) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := e.Check(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintln(w, err)
		return
	}
	e.mu.Lock()
	resigning := e.resigning
	e.mu.Unlock()
	if resigning != nil {
		_, _ = fmt.Fprintf(w, "ok: not leading; the work of the term with token %v has returned, and its resign is waiting for the store\n", resigning.Token())
		return
	}
	_, _ = fmt.Fprintln(w, "ok")
}
