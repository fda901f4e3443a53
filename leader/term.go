package leader

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Campaign blocks until this candidate leads the election (the state store
// key named election) and returns its term, publishing value (an address,
// say) for observers. It returns an error only if ctx ends first, the
// client is closed, the options are invalid, the store refuses a request
// (an error wrapping a *sskv.ServiceError, e.g. sskv.ErrTimestampSkew when
// this client's clock is more than a minute ahead of the store's; trying
// again would be refused the same way), or the key holds something that
// will never be released to a candidate (an error wrapping
// lock.ErrNotALock: a semaphore's record, another client's lock such as
// the SDK's leased lock, or a value no lock writes). A campaign that gives up leaves no
// key behind, even if its last attempt had an unknown outcome.
//
// While another candidate leads, Campaign sleeps on the key's notifications
// and sends no request; it tries at once when the key is deleted, by a
// resignation or by expiry. When the election is free, it costs two
// requests: the SET that takes the key and the fenced SET that records the
// term's token in it.
func Campaign(ctx context.Context, c *sskv.Client, election string, value []byte, opts ...Option) (*Term, error) {
	o := newOptions(opts)
	return campaign(ctx, c, election, value, &o)
}

func campaign(ctx context.Context, c *sskv.Client, election string, value []byte, o *options) (*Term, error) {
	pr, err := newPrioritized(c, election, value, o)
	if err != nil {
		return nil, &electionError{election, "campaign", err}
	}
	var challenged sync.WaitGroup
	cctx, stopChallenge := context.WithCancel(ctx)
	if pr != nil {
		challenged.Go(func() { pr.challenge(cctx) })
	}
	// A follower keeps no Lock while it waits (see lock.Acquire).
	l, err := lock.Acquire(ctx, c, o.lockConfig(election, value))
	stopChallenge()
	challenged.Wait()
	if err != nil {
		return nil, &electionError{election, "campaign", err}
	}
	t := &Term{l: l, value: bytes.Clone(value)}
	if pr != nil {
		var cancel context.CancelCauseFunc
		t.ctx, cancel = context.WithCancelCause(l.Context())
		t.xfer.onRequest(cancel)
		pr.lead(t)
	}
	leading := o.metrics.Leading // not o: the term keeps no copy of the options
	if o.endTime || leading != nil {
		context.AfterFunc(l.Context(), func() {
			t.ended.Store(time.Now())
			if leading != nil {
				leading(false)
			}
		})
	}
	if leading != nil {
		leading(true)
	}
	return t, nil
}

// Term is one candidate's leadership, from its election to its loss or
// resignation. It is a token source for package fenced: writes fenced with
// it are refused once a newer term has written the same keys.
//
// Its methods are safe for concurrent use.
type Term struct {
	// l is the term's own Lock, which acquires nothing more: its name is
	// the election, its token the term's.
	l     *lock.Lock
	ended atomic.Value // time.Time: when the term ended
	// ctx is the term's Context with WithPriority: it also ends when the
	// term is to be handed over. Nil without: the Lock's.
	ctx  context.Context
	xfer transfer // a request to hand the term over

	mu        sync.Mutex
	value     []byte
	proclaims int // Proclaims begun: a refused one restores value unless another followed
}

// Election returns the name of the election.
func (t *Term) Election() string { return t.l.Name() }

// CandidateID returns the id this candidate wrote in the election's key.
func (t *Term) CandidateID() string { return t.l.HolderID() }

// Token returns the term's fencing token: the version the store gave the
// election's key when this candidate took it. A later term's token is
// always greater. It stays readable after the term ended.
func (t *Term) Token() hlc.Timestamp { return t.l.Token() }

// Value returns the value the leader publishes, as of its last Proclaim.
func (t *Term) Value() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.value)
}

// Context returns a context cancelled the moment the term ends (lost or
// resigned); context.Cause of it is Err. Give it to the leader's work.
// With [WithPriority], it also ends, with cause [ErrTransferred], when a
// candidate of a higher priority asks for the term: the term still holds
// the key, and Resign, once the work has returned, hands it over.
func (t *Term) Context() context.Context {
	if t.ctx != nil {
		return t.ctx
	}
	return t.l.Context()
}

// Done returns a channel closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.l.Done() }

// Err returns nil while this candidate leads, and otherwise why the term
// ended: an error wrapping ErrLost and its reason (lock.ErrRenewDeadline,
// lock.ErrHeldByOther, lock.ErrFenced, lock.ErrClosed), or ErrResigned.
func (t *Term) Err() error { return t.l.Err() }

// FencingToken returns the token to fence a write with, or an error if the
// term has ended. It checks the renew deadline on the monotonic clock
// itself, so a leader that wakes from a pause finds its term over before
// its first write. Package fenced calls it for every write.
func (t *Term) FencingToken() (hlc.Timestamp, error) { return t.l.FencingToken() }

// FencingConn returns the term's token and the connection to send a fenced
// write on, after confirming the election's key if the connection was lost
// meanwhile (see lock.Lock.FencingConn). Package fenced calls it for every
// write.
func (t *Term) FencingConn(ctx context.Context) (hlc.Timestamp, *sskv.Conn, error) {
	return t.l.FencingConn(ctx)
}

// Fenced ends the term as lost (lock.ErrFenced): a write fenced with its
// token was refused because a newer term has written the key. Package
// fenced calls it.
func (t *Term) Fenced(token hlc.Timestamp, err error) { t.l.Fenced(token, err) }

// Proclaim changes the value the leader publishes without giving up
// leadership: one SET of the election's key, fenced with the term's token,
// which also renews the term. The fence guarantees it never overwrites
// another candidate's record: if a newer term holds the key, the store
// refuses the write, and this term ends as lost.
//
// An error wrapping ErrLost or ErrResigned means the term has ended. An
// error wrapping sskv.ErrTooLarge means the value does not fit in a
// request the broker takes: nothing was sent, and the term goes on with
// its earlier value. Any other error means the outcome is unknown; the
// term then writes the new value with its next renewal.
func (t *Term) Proclaim(ctx context.Context, value []byte) error {
	err := t.l.Err()
	if err == nil {
		// Even if the outcome is unknown, the next renewal writes value.
		t.mu.Lock()
		prev := t.value
		t.value = bytes.Clone(value)
		t.proclaims++
		gen := t.proclaims
		t.mu.Unlock()
		err = t.l.SetValue(ctx, value)
		if errors.Is(err, sskv.ErrTooLarge) {
			t.mu.Lock()
			if t.proclaims == gen { // unless a later Proclaim set its own
				t.value = prev
			}
			t.mu.Unlock()
		}
	}
	if err != nil {
		return &electionError{t.l.Name(), "proclaim", err}
	}
	return nil
}

// Resign ends the term and deletes the election's key if it is still this
// term's, so another candidate takes over at once, without waiting for the
// TTL. Call it after the work the term guarded has returned. Resigning a
// term that was lost still deletes the key if it is still this term's; a
// term is resigned once, and later calls return nil. An error means the
// key may not have been deleted (the store did not answer, or the client
// was closed): it then expires after at most the TTL.
//
// A term asked to hand over (see [WithPriority] and [Elector.Transfer])
// goes to that candidate, as Transfer does; if it cannot (the term was
// lost meanwhile), Resign does what it does for any term.
func (t *Term) Resign(ctx context.Context) error {
	err, _ := t.giveUp(ctx, t.xfer.target())
	if err != nil {
		return &electionError{t.l.Name(), "resign", err}
	}
	return nil
}

// Transfer ends the term and hands the election to the candidate whose id
// is candidateID, as Resign does but without a race: one write, fenced with
// the term's token, reserves the key for that candidate, which takes it at
// once if it campaigns; the other candidates go on waiting. Call it after
// the work the term guarded has returned. A candidate that does not
// campaign any more lets the reservation expire: after a TTL, an ordinary
// election follows.
//
// The candidate must campaign with that id ([WithCandidateID], or a
// [WithPriority] candidate's own). An error means the term was not handed
// over: it had ended already (lost or resigned; the key is deleted as
// Resign would), or the write's outcome is unknown (the key is then
// handed over, or expires after the TTL).
func (t *Term) Transfer(ctx context.Context, candidateID string) error {
	if candidateID == "" || candidateID == t.CandidateID() || strings.Contains(candidateID, "\n") {
		// Checked before the term is given up: it goes on.
		return &electionError{t.l.Name(), "transfer", fmt.Errorf("%w: invalid candidate id %q (empty, the leader's own, or with a newline)", ErrConfig, candidateID)}
	}
	err, notHanded := t.giveUp(ctx, candidateID)
	if err == nil {
		err = notHanded
	}
	if err != nil {
		return &electionError{t.l.Name(), "transfer", err}
	}
	return nil
}

// giveUp ends the term: hands it to the candidate to, or resigns it if to
// is empty. err is Resign's error; notHanded, why a transfer did not hand
// it over (a term resigned or lost before).
func (t *Term) giveUp(ctx context.Context, to string) (err, notHanded error) {
	if to == "" {
		err = t.l.Unlock(ctx)
	} else {
		err = t.l.UnlockTo(ctx, to)
		if errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrClosed) || errors.Is(err, ErrLost) {
			notHanded, err = err, nil
		}
	}
	if errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrClosed) {
		err = nil
	}
	if cerr := t.l.Close(ctx); err == nil && !errors.Is(cerr, lock.ErrNotHeld) {
		err = cerr
	}
	return err, notHanded
}

// endedAt returns when the term ended; zero while it lasts, and for a term
// whose options did not ask for it (see options.endTime).
func (t *Term) endedAt() time.Time {
	v, _ := t.ended.Load().(time.Time)
	return v
}
