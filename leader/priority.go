package leader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// ErrTransferred is the cause of a term's work context ended because the
// term is to be handed over: by [Elector.Transfer], to a candidate of a
// higher priority (see [WithPriority]), or, in a [Group], to the member the
// assignment now gives the election. The term still holds the key until
// the work has returned; then Resign (or Run) hands it over.
var ErrTransferred = errors.New("leader: leadership is being transferred")

// ErrNotLeading is returned by [Elector.Transfer] when the Elector does not
// lead.
var ErrNotLeading = errors.New("leader: not leading")

// The keys of the priority protocol, next to the election's key.
func priorityKey(election string) string  { return election + "\x00priority" }
func challengeKey(election string) string { return election + "\x00challenge" }

// priorityTTLs is how many TTLs the priority a leader publishes lasts: it
// is written once per term, not at each renewal.
const priorityTTLs = 10

// priorityValue is the value of the priority and challenge keys: the
// candidate's id, a space, and its priority.
func priorityValue(id string, p int) []byte { return []byte(id + " " + strconv.Itoa(p)) }

// parsePriority reads a value of priorityValue. It reports false for
// anything else.
func parsePriority(v []byte) (id string, p int, ok bool) {
	i := bytes.LastIndexByte(v, ' ')
	if i <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(string(v[i+1:]))
	if err != nil || p < 0 {
		return "", 0, false
	}
	return string(v[:i]), p, true
}

// transfer records a request to hand a term over. The first request wins.
type transfer struct {
	mu      sync.Mutex
	to      string                    // the candidate the term goes to; empty if none asked
	cancels []context.CancelCauseFunc // end the work's contexts
}

// request asks that the term go to id, and ends the work's context. It
// reports the candidate the term goes to: id, or an earlier request's.
func (x *transfer) request(id string) string {
	x.mu.Lock()
	if x.to == "" {
		x.to = id
	}
	to, cancels := x.to, x.cancels
	x.mu.Unlock()
	for _, cancel := range cancels {
		cancel(fmt.Errorf("%w to %q", ErrTransferred, to))
	}
	return to
}

// target returns the candidate the term goes to, or "".
func (x *transfer) target() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.to
}

// onRequest makes cancel end the work's context at a request (at once if
// one came already).
func (x *transfer) onRequest(cancel context.CancelCauseFunc) {
	x.mu.Lock()
	x.cancels = append(x.cancels, cancel)
	to := x.to
	x.mu.Unlock()
	if to != "" {
		cancel(fmt.Errorf("%w to %q", ErrTransferred, to))
	}
}

// prioritized is what a campaign with WithPriority needs beside the lock.
type prioritized struct {
	c        *sskv.Client
	election string
	id       string
	p        int
	ttl      time.Duration
	log      *slog.Logger
}

// newPrioritized returns the priority protocol's side of a campaign of o,
// or nil without WithPriority. It fixes o's candidate id: a reservation
// and a challenge name it, so it must not change between attempts.
func newPrioritized(c *sskv.Client, election string, value []byte, o *options) (*prioritized, error) {
	if !o.prioritySet {
		return nil, nil
	}
	if err := checkPriority(c, election, o); err != nil {
		return nil, err
	}
	if o.candidateID == "" {
		o.candidateID = c.ID() + "/" + randHex(8)
	}
	l, err := lock.New(c, o.lockConfig(election, value)) // validates; sends nothing
	if err != nil {
		return nil, err
	}
	log := o.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &prioritized{c: c, election: election, id: o.candidateID, p: o.priority, ttl: l.Config().TTL, log: log}, nil
}

// checkPriority checks WithPriority's value, and that the challenge key of
// election can be watched through c.
func checkPriority(c *sskv.Client, election string, o *options) error {
	if o.priority < 0 {
		return fmt.Errorf("%w: negative priority %d", ErrConfig, o.priority)
	}
	if n, maxKey := len(challengeKey(election)), c.MaxWatchKey(); n > maxKey {
		return fmt.Errorf("%w: the election's name is too long for WithPriority: its challenge key has %d bytes, and this client can watch keys of at most %d (%w)",
			ErrConfig, n, maxKey, sskv.ErrKeyTooLong)
	}
	return nil
}

// challenge runs while the candidate waits, until ctx ends: at each new
// term whose leader's priority is lower than the candidate's, it writes
// the challenge, and renews it every TTL/3 while it still outranks the
// leader. It gives the challenge back (VDEL) when it ends.
func (pr *prioritized) challenge(ctx context.Context) {
	if pr.p <= 0 {
		return
	}
	kick := make(chan struct{}, 1)
	var (
		mu     sync.Mutex
		latest lock.Holder
	)
	w, err := pr.c.Watch(ctx, pr.election, sskv.WithCallback(func(ev sskv.Event) {
		mu.Lock()
		latest = lock.ParseHolder(ev.Value, ev.Version)
		mu.Unlock()
		select {
		case kick <- struct{}{}:
		default:
		}
	}, nil), sskv.Detached())
	if err != nil {
		if ctx.Err() == nil {
			pr.log.Debug("cannot watch the election; not challenging", "error", err)
		}
		return
	}
	defer w.Stop()
	mine := priorityValue(pr.id, pr.p)
	wrote := false
	defer func() {
		if !wrote {
			return
		}
		// A challenge left behind could have the leader hand over to a
		// candidate that has gone (a TTL without a leader); but the
		// campaign's return waits for this: a store away costs at most a
		// second (the TTL if shorter), and the challenge expires anyway.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(pr.ttl, time.Second))
		defer cancel()
		_, _ = pr.c.VDel(dctx, challengeKey(pr.election), mine, sskv.DelOptions{})
	}()

	// renew fires TTL/3 after a judgment that found this candidate
	// outranking the leader (to renew its challenge), or that failed; it
	// is stopped otherwise: a candidate that does not challenge sends
	// nothing and wakes for nothing while the leader renews.
	renew := time.NewTimer(time.Hour)
	renew.Stop()
	defer renew.Stop()
	var term lock.Holder // the term last judged
	// judge reads the leader's priority and writes the challenge if this
	// candidate outranks it; it reports whether to judge again later.
	judge := func() (again bool) {
		rctx, cancel := context.WithTimeout(ctx, pr.ttl)
		defer cancel()
		lp := 0
		if res, err := pr.c.Get(rctx, priorityKey(pr.election)); err == nil && res.Found {
			if id, p, ok := parsePriority(res.Value); ok && id == term.ID {
				lp = p
			}
		} else if err != nil {
			return true
		}
		if lp >= pr.p {
			return false
		}
		// Another challenger of a priority as high keeps its challenge.
		if res, err := pr.c.Get(rctx, challengeKey(pr.election)); err == nil && res.Found && !bytes.Equal(res.Value, mine) {
			if _, p, ok := parsePriority(res.Value); ok && p >= pr.p {
				return true
			}
		}
		if _, err := pr.c.Set(rctx, challengeKey(pr.election), mine, sskv.SetOptions{Expiry: pr.ttl}); err != nil {
			pr.log.Debug("could not write the challenge", "error", err)
			return true
		}
		if !wrote {
			pr.log.Info("challenging the leader", "leader", term.ID, "leader priority", lp, "priority", pr.p)
		}
		wrote = true
		return true
	}
	rejudge := func(again bool) {
		renew.Stop()
		if again {
			renew.Reset(max(pr.ttl/3, time.Millisecond))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
			mu.Lock()
			h := latest
			mu.Unlock()
			if h.Token.IsZero() || h.ID == pr.id {
				// Nobody leads (or a handover to this candidate): the
				// campaign takes the key.
				term = h
				rejudge(false)
				continue
			}
			if h.Token != term.Token || h.ID != term.ID {
				term = h
				rejudge(judge())
			}
		case <-renew.C:
			rejudge(judge())
		}
	}
}

// lead publishes the leader's priority and, while term t lasts, watches
// the challenges: one of a higher priority than t's asks t to hand over to
// the challenger (t's work context ends with ErrTransferred).
func (pr *prioritized) lead(t *Term) {
	ctx := t.l.Context()
	pctx, cancel := context.WithTimeout(ctx, pr.ttl)
	_, err := pr.c.Set(pctx, priorityKey(pr.election), priorityValue(pr.id, pr.p), sskv.SetOptions{Expiry: priorityTTLs * pr.ttl})
	cancel()
	if err != nil && ctx.Err() == nil {
		pr.log.Warn("could not publish the leader's priority; challengers count it 0", "error", err)
	}
	w, err := pr.c.Watch(ctx, challengeKey(pr.election), sskv.WithCallback(func(ev sskv.Event) {
		if ev.Op != sskv.OpSet {
			return
		}
		id, p, ok := parsePriority(ev.Value)
		if !ok || id == pr.id || p <= pr.p || strings.Contains(id, "\n") {
			return
		}
		if to := t.xfer.request(id); to == id {
			pr.log.Info("handing over to a candidate of a higher priority once the work has returned", "to", id, "priority", p)
		}
	}, nil), sskv.Detached())
	if err != nil {
		if ctx.Err() == nil {
			pr.log.Warn("cannot watch the challenges; this term is not handed over by priority", "error", err)
		}
		return
	}
	context.AfterFunc(ctx, func() { w.Stop() })
}
