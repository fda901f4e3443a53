package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// handoverTag is the token part of the reservation [Lock.UnlockTo] writes,
// an acquisition record (see ParseHolder): nobody holds the lock while it
// is in the key.
const handoverTag = "~handover"

// Reservation returns the record by which UnlockTo reserves the key for
// holderID.
func Reservation(holderID string) []byte {
	return []byte(holderID + "\n" + handoverTag + "\n")
}

// IsReservation reports whether value is reservation(holderID), without
// making it: a waiter checks each notification of the key.
func IsReservation(value []byte, holderID string) bool {
	n := len(holderID)
	return len(value) == n+len(handoverTag)+2 && string(value[:n]) == holderID && value[n] == '\n' &&
		string(value[n+1:len(value)-1]) == handoverTag && value[len(value)-1] == '\n'
}

// DropReservation deletes the key if it is reserved for this Lock: a turn
// with a reservation that reached it too late to be handed on (its queue
// has ended) would keep the key from the next waiter until it expired.
// Like a release, it does not wait for a connection (see connNow): without
// one, the reservation expires after the TTL. The caller has the turn.
func (l *Lease) DropReservation(ctx context.Context) {
	conn, ctx, stop, err := l.connNow(ctx)
	if err != nil {
		l.log.Debug("not connected; a reservation of the key for this Lock, if any, expires after the TTL", "error", err)
		return
	}
	defer stop()
	rec := l.AcqRecord()
	res, err := conn.Get(ctx, l.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, rec) {
		return
	}
	if _, err := conn.VDel(ctx, l.cfg.Name, rec, sskv.DelOptions{FencingToken: res.Version}); err != nil {
		l.log.Debug("could not free the key reserved for this Lock; it expires after the TTL", "error", err)
	}
}

// endedRelease bounds a release asked for with a context already done:
// past a TTL, there is nothing left to release.
func endedRelease(ttl time.Duration) time.Duration { return min(ttl, time.Second) }

// Queue is a wait queue's part in a release (see package wait's queue).
type Queue interface {
	// HandOnKept: the release could not delete the key (no connection);
	// the turn goes on all the same, to be taken once the key is free.
	HandOnKept()
	// HandOver returns the first waiter, if any, to hand the lock to.
	HandOver() (first Next, ok bool)
	// SendTurn tells the first waiter its turn, with the token of the
	// reservation written for it, or zero.
	SendTurn(token hlc.Timestamp)
	// Release ends the queue's part in the release.
	Release()
}

// Next is the first waiter of a queue, as a release hands over to it.
type Next struct {
	ID      string
	Rec     []byte // its acquisition record, which a reservation writes
	Watches bool   // it watches the key: its turn goes out with the delete
}

// Release ends the holding and deletes the key if it is still this Lock's.
// The caller has the turn. With to (UnlockTo), a holding that lasted
// until now writes a reservation for to in place of the delete.
func (l *Lease) Release(ctx context.Context, to string, q Queue) (err error) {
	h := l.holding()
	if h.sched == nil { // never acquired
		return l.Wrap("unlock", ErrNotHeld)
	}
	if ctx.Err() != nil {
		// The caller's context has ended (a cancelled request, a shutdown
		// under way): the key would stay for a TTL. Try all the same,
		// within a short time of its own.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), endedRelease(l.cfg.TTL))
		defer cancel()
	}
	held := h.finish(ErrReleased) // false: it was lost (or released) before
	if !held && errors.Is(h.err(), ErrReleased) {
		return l.Wrap("unlock", ErrNotHeld)
	}
	var opts sskv.DelOptions
	if l.cfg.FenceKey {
		opts.FencingToken = h.token
	}
	conn, ctx, stop, err := h.releaseConn(ctx)
	if err != nil {
		// Nothing can be deleted: the key expires within its TTL. The queue
		// still goes to its first waiter, which takes the key once it is
		// free.
		if q != nil {
			q.HandOnKept()
			q.Release()
		}
		return l.Wrap("unlock", err)
	}
	defer stop()
	var first Next
	handover := false
	if q != nil {
		first, handover = q.HandOver()
		defer q.Release()
	}
	// Only a holding that lasted until now hands over with a reservation:
	// the key of one that was lost may be another's by now, not yet fenced
	// by it.
	if handover && held && l.cfg.FenceKey && !h.hasLate() {
		// One write hands the key to the longest waiter: the fence makes
		// sure it replaces only this holding's own record.
		res, err := conn.Set(ctx, l.cfg.Name, first.Rec, sskv.SetOptions{Expiry: l.cfg.TTL, FencingToken: h.token})
		// The turn goes to the first waiter whatever came of the SET: with
		// the reservation's token, or without one to take the key once it
		// is free.
		var token hlc.Timestamp
		if err == nil {
			token = res.Version
		}
		q.SendTurn(token)
		switch {
		case err == nil:
			l.log.Info("released; handed over", "to", first.ID)
			return nil
		case errors.Is(err, sskv.ErrFencingTokenLower):
			l.log.Info("released; a newer holder has the key")
			return nil
		case lost(conn) || errors.Is(err, sskv.ErrNotSent):
			return l.Wrap("unlock", fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err))
		}
		return l.Wrap("unlock", err)
	}
	if to != "" && q == nil {
		if held && !h.hasLate() {
			return l.handTo(ctx, conn, h, to)
		}
		// Lost, or a late write of the holding's may still land: the key may
		// be another's by now, not yet fenced by it. Deleted as by Unlock.
		why := h.err()
		if held {
			why = errors.New("a write of the holding whose outcome is unknown may still land")
		}
		defer func() {
			if err == nil {
				err = l.Wrap("unlock to", fmt.Errorf("not handed over to %q: %w", to, why))
			}
		}()
	}
	switch {
	case handover && first.Watches:
		// The turn goes out with the delete, not after its answer: the
		// first waiter watches the key, and takes it once it has both
		// (or, if the delete fails, when the key expires).
		q.SendTurn(hlc.Timestamp{})
	case handover:
		// After the delete: the first waiter, which does not watch the
		// key, takes it when its turn comes.
		defer q.SendTurn(hlc.Timestamp{})
	}
	// Without a fence there is no write that replaces only this holding's
	// record: the release deletes it, and the first waiter in the queue
	// takes it (see package wait's queue.go).
	res, err := conn.VDel(ctx, l.cfg.Name, h.record(), opts)
	// ErrNotSent: the connection is lost, though the client may not have
	// marked it so yet (the write failed first).
	if err != nil && (lost(conn) || errors.Is(err, sskv.ErrNotSent)) {
		err = fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err)
	}
	if errors.Is(err, sskv.ErrFencingTokenLower) {
		// A newer holding fences the key: it is not this one's any more.
		l.log.Info("released; a newer holder has the key")
		return nil
	}
	if err != nil {
		return l.Wrap("unlock", err)
	}
	l.log.Info("released", "deleted", res.Deleted)
	return nil
}

// handTo writes the reservation of the key for to, fenced with the token of
// h, the holding just released (see UnlockTo), on conn.
func (l *Lease) handTo(ctx context.Context, conn *sskv.Conn, h *holding, to string) error {
	_, err := conn.Set(ctx, l.cfg.Name, Reservation(to), sskv.SetOptions{Expiry: l.cfg.TTL, FencingToken: h.token})
	switch {
	case err == nil:
		l.log.Info("released; handed over", "to", to)
		return nil
	case errors.Is(err, sskv.ErrFencingTokenLower):
		return l.Wrap("unlock to", fmt.Errorf("not handed over to %q: a newer holder has the key: %w", to, err))
	case lost(conn) || errors.Is(err, sskv.ErrNotSent):
		return l.Wrap("unlock to", fmt.Errorf("%w; the key is gone or expires within its TTL: %w", ErrNotReleased, err))
	}
	return l.Wrap("unlock to", err)
}
