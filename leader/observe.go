package leader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// State is the leadership of an election as observers see it.
type State struct {
	// ID is the leader's candidate id; empty when nobody leads.
	ID string
	// Value is what the leader publishes (Campaign's value, then Proclaim's).
	Value []byte
	// Token is the leader's term token; zero when nobody leads.
	Token hlc.Timestamp
	// Resync marks a State that Observe reports in place of changes it may
	// have missed one by one (a reconnect, or a consumer that fell behind).
	Resync bool
}

// HasLeader reports whether someone leads.
func (s State) HasLeader() bool { return !s.Token.IsZero() }

// same reports whether s and u are the same leadership (Resync aside).
func (s State) same(u State) bool {
	return s.ID == u.ID && s.Token == u.Token && bytes.Equal(s.Value, u.Value)
}

// stateOf reads the election's key. A candidate that has taken the key
// but not yet recorded its token is not leading yet.
func stateOf(value []byte, version hlc.Timestamp) State {
	h := lock.ParseHolder(value, version)
	if h.Token.IsZero() {
		return State{}
	}
	return State{ID: h.ID, Value: h.Value, Token: h.Token}
}

// Leader returns who leads the election now (one GET). A State without a
// leader is not an error.
//
// It reads the key as it is: for the moment that a write of an ended term
// reaching the store late (a Proclaim held on a frozen path) sits on the
// key before the next leader's token replaces it, Leader returns that
// ended term. Observe does not report it again.
func Leader(ctx context.Context, c *sskv.Client, election string) (State, error) {
	if c == nil {
		return State{}, &electionError{election, "leader", fmt.Errorf("%w: nil sskv.Client", ErrConfig)}
	}
	res, err := c.Get(ctx, election)
	if err != nil {
		return State{}, &electionError{election, "leader", err}
	}
	return stateOf(res.Value, res.Version), nil
}

// observeQueue is how many changes Observe holds for a consumer that is
// not reading; beyond it, changes are coalesced into one Resync state.
const observeQueue = 64

// observeEnded is how many ended terms Observe remembers, so as not to
// report one again.
const observeEnded = 4

// Observe reports the leadership of the election: first its state now,
// then each change (a new term, a Proclaim, nobody leading) in order. It
// sends no request while a leader merely renews.
//
// It survives reconnects: a change that happened while the connection was
// down is reported as a State with Resync set, never skipped silently. A
// consumer that falls behind by more than 64 changes gets the latest
// state, with Resync set, in place of the ones it missed. A term it has
// reported ended is not reported again, even if a late write of that term
// lands on the key for a moment. The channel is
// closed when ctx ends or the client is closed. The error is that of the
// first registration of the watch.
func Observe(ctx context.Context, c *sskv.Client, election string, opts ...Option) (<-chan State, error) {
	if c == nil {
		return nil, &electionError{election, "observe", fmt.Errorf("%w: nil sskv.Client", ErrConfig)}
	}
	o := newOptions(opts)
	log := o.logger
	w, err := c.Watch(ctx, election)
	if err != nil {
		return nil, &electionError{election, "observe", err}
	}
	out := make(chan State)
	go func() {
		defer close(out)
		var (
			queue   []State
			last    State
			first   = true // the next Initial event is the watch's first: no Resync
			retry   = backoff.NewExponentialBackOff()
			rewatch <-chan time.Time // fires when it is time to watch again
		)
		retry.InitialInterval = 10 * time.Millisecond
		retry.MaxInterval = time.Second
		retry.MaxElapsedTime = 0
		// ended holds the tokens of the last terms this observer saw end.
		// A state with one of them is a late write of an ended term (a
		// Proclaim held on a frozen path that lands between the two SETs
		// of the next leader's acquisition) and is not reported. Only an
		// exact token matches, so a new term after a store restart, whose
		// token may be older, is never hidden.
		var (
			ended     [observeEnded]hlc.Timestamp
			nextEnded int
		)
		push := func(s State) {
			if s.HasLeader() && s.Token != last.Token {
				for _, t := range ended {
					if t == s.Token {
						if log != nil {
							log.Debug("observe: dropped a late write of an ended term", "election", election, "token", s.Token)
						}
						return
					}
				}
			}
			if s.same(last) {
				return
			}
			if last.HasLeader() && s.Token != last.Token {
				ended[nextEnded] = last.Token
				nextEnded = (nextEnded + 1) % observeEnded
			}
			last = s
			if len(queue) >= observeQueue {
				queue = queue[:observeQueue-1]
				s.Resync = true
			}
			queue = append(queue, s)
		}
		for {
			var send chan State
			var next State
			if len(queue) > 0 {
				send, next = out, queue[0]
			}
			var events <-chan sskv.Event
			if w != nil {
				events = w.Events()
			}
			select {
			case <-ctx.Done():
				return
			case send <- next:
				queue = queue[1:]
			case ev, ok := <-events:
				if !ok {
					if errors.Is(w.Err(), sskv.ErrClosed) || ctx.Err() != nil {
						return
					}
					if log != nil {
						log.Debug("observe: watch ended; watching again", "election", election, "error", w.Err())
					}
					w = nil
					rewatch = time.After(retry.NextBackOff())
					continue
				}
				s := stateOf(ev.Value, ev.Version)
				// The state a watch starts from: the first is Observe's
				// first state, and that of a watch set up again stands in
				// for what the ended one may have missed.
				s.Resync = ev.Resync || (ev.Initial && !first)
				if first {
					first = false
					last = s
					queue = append(queue, s)
					continue
				}
				push(s)
			case <-rewatch:
				nw, err := c.Watch(ctx, election)
				if err != nil {
					if errors.Is(err, sskv.ErrClosed) {
						return
					}
					rewatch = time.After(retry.NextBackOff())
					continue
				}
				retry.Reset()
				w, rewatch = nw, nil
			}
		}
	}()
	return out, nil
}
