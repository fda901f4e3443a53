package lock

import (
	"bytes"
	"encoding/hex"

	"github.com/dsslock/dsslock/hlc"
)

// Holder is who holds a lock, as the store has it.
type Holder struct {
	// ID is the holder's HolderID; empty when the lock is free.
	ID string
	// Token is the holder's fencing token, when the lock's key records it
	// (Config.FenceKey); zero otherwise, and zero for a holder that has
	// taken the key but not yet recorded its token (its acquisition is
	// under way, and it does not hold the lock yet).
	Token hlc.Timestamp
	// Value is the value the holder publishes (Config.Value and
	// Lock.SetValue); nil without FenceKey.
	Value []byte
	// Version is the key's version: that of the holder's latest write
	// (acquisition, renewal or SetValue), at or after its fencing token.
	// Zero when the lock is free.
	Version hlc.Timestamp
}

// Held reports whether anyone holds the lock.
func (h Holder) Held() bool { return h.ID != "" || !h.Version.IsZero() }

// ParseHolder reads the value and version of a lock's key (from a GET or a
// KEYNOTIFY event) as a Holder. A key written with Config.FenceKey holds
//
//	HolderID "\n" token "\n" Value
//
// with the token written by the second SET of an acquisition: the SET that
// takes the key (the store gives the token in its answer) writes "~" and a
// nonce of the Lock's in its place, so that no two Locks' acquisitions
// under way ever write the same record, even with the same HolderID. Any
// other value is a HolderID alone. A nil value is a free lock.
func ParseHolder(value []byte, version hlc.Timestamp) Holder {
	if value == nil {
		return Holder{}
	}
	id, rest, ok := bytes.Cut(value, []byte{'\n'})
	if !ok {
		return Holder{ID: string(value), Version: version}
	}
	tok, val, ok := bytes.Cut(rest, []byte{'\n'})
	if !ok {
		return Holder{ID: string(value), Version: version}
	}
	h := Holder{ID: string(id), Value: bytes.Clone(val), Version: version}
	if len(tok) > 0 && tok[0] != '~' {
		t, err := hlc.ParseBytes(tok)
		if err != nil {
			return Holder{ID: string(value), Version: version}
		}
		h.Token = t
	}
	return h
}

// record is the key's value for a holding with token (zero in the SET that
// takes the key, whose record carries the Lock's nonce instead) publishing
// value: the HolderID alone without FenceKey.
func (l *Lock) record(token hlc.Timestamp, value []byte) []byte {
	if !l.cfg.FenceKey {
		return []byte(l.cfg.HolderID)
	}
	b := make([]byte, 0, len(l.cfg.HolderID)+2+40+len(value))
	b = append(b, l.cfg.HolderID...)
	b = append(b, '\n')
	if token.IsZero() {
		b = append(b, '~')
		b = hex.AppendEncode(b, l.nonce[:])
	} else {
		b, _ = token.AppendText(b)
	}
	b = append(b, '\n')
	return append(b, value...)
}

// acqRecord is the record of this Lock's acquisitions: what its queue join
// carries and a reservation for it writes.
func (l *Lock) acqRecord() []byte { return l.record(hlc.Timestamp{}, l.value()) }
