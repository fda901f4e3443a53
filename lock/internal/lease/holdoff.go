package lease

import (
	"bytes"
	"context"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// HoldOff returns when an acquisition through cn may take a missing key:
// a TTL after cn came up if the client was cut off from the store before it
// (a reconnection, or a first connection that came after failed attempts),
// else at once.
//
// The store may have restarted, and lost the key, while the client was cut
// off, at any moment before cn came up: the key's holder, cut off from the
// store or not yet reconnected, still counts on the key until its renew
// deadline, which passes within a TTL of its last renewal on its own clock.
// Before then, nobody may take the key: not a waiter of this Lock, whatever
// it saw, nor a new Lock or Campaign of the same process, which could not
// know what an earlier one saw, nor a process that started while the store
// was down. A process that connects at once has seen nothing, and cannot
// tell a restart just before from none.
func (l *Lease) HoldOff(cn *sskv.Conn) time.Time { return HoldOff(cn, l.cfg.TTL) }

// HoldOff is Lease.HoldOff for a lock of the given TTL.
func HoldOff(cn *sskv.Conn, ttl time.Duration) time.Time {
	if !cn.AfterOutage() {
		return time.Time{}
	}
	return cn.Since().Add(ttl)
}

// ReservedOn reports whether a read through cn finds the key reserved for
// this Lock (its acquisition record, written by a holder that handed the
// lock to it), and the reservation's version, which the SET that takes the
// key is fenced with; cn is the connection that SET goes out on.
//
// Such a reservation lets the Lock take the key within its hold-off after
// a reconnect (see holdOff), which guards against taking a key that
// vanished with a store restart while its holder still counts on it. A key
// that holds the reservation has not vanished from the store cn reaches (a
// restart after the read would end cn, and the SET with it). Whoever wrote
// the reservation held the key until then, as a holding that was never
// lost, and so nobody else held it meanwhile, and it has handed the key on
// (a release). Nobody counts on the key but this Lock. A reservation this Lock has only heard of (a
// turn's version) is not enough: it may have expired, and the key been
// taken, and lost with a restart, since.
func (l *Lease) ReservedOn(ctx context.Context, cn *sskv.Conn) (hlc.Timestamp, bool) {
	rctx, cancel := l.Until(ctx, time.Now().Add(l.cfg.TTL))
	defer cancel()
	res, err := cn.Get(rctx, l.cfg.Name)
	if err != nil || !res.Found || !bytes.Equal(res.Value, l.AcqRecord()) {
		return hlc.Timestamp{}, false
	}
	return res.Version, true
}
