package lease

import (
	"bytes"
	"encoding/hex"
	"fmt"

	"github.com/dsslock/dsslock/hlc"
)

// record is the key's value for a holding with token (zero in the SET that
// takes the key, whose record carries the Lock's nonce instead) publishing
// value: the HolderID alone without FenceKey.
func (l *Lease) record(token hlc.Timestamp, value []byte) []byte {
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

// AcqRecord is the record of this Lock's acquisitions: what its queue join
// carries and a reservation for it writes.
func (l *Lease) AcqRecord() []byte { return l.record(hlc.Timestamp{}, l.Value()) }

// fenceRecord reports whether value is a record that a Lock with FenceKey
// writes (as ParseHolder reads one), and returns its HolderID.
func fenceRecord(value []byte) (string, bool) {
	id, rest, ok := bytes.Cut(value, []byte{'\n'})
	if !ok {
		return "", false
	}
	tok, _, ok := bytes.Cut(rest, []byte{'\n'})
	if !ok {
		return "", false
	}
	if len(tok) > 0 && tok[0] != '~' {
		if _, err := hlc.ParseBytes(tok); err != nil {
			return "", false
		}
	}
	return string(id), true
}

// CheckRecord returns an error wrapping ErrNotALock if the key of a lock
// (with FenceKey set or not, as fenceKey says) holds value, which will never
// be released to that lock: a Semaphore's or RWMutex's record, which never expires; the
// record of a lock with the other FenceKey setting (an election's, say);
// or a value no lock writes. It returns nil for a missing key (nil) and for
// what a holder of the same kind writes, which expires or is released:
// without FenceKey, a HolderID alone (a Lock's, or another client's lock,
// such as the Azure IoT Operations SDK's leased lock, which writes its
// holder's name, and which a Lock without FenceKey shares a key with).
//
// The store does not tell whether a key expires: a value is judged by what
// it is. Every waiter of a lock decides by it (a read, or a notification
// of the key) before it waits on the key.
func CheckRecord(fenceKey bool, value []byte) error {
	var what string
	switch id, fenced := fenceRecord(value); {
	case value == nil:
		return nil
	case fenced && fenceKey:
		return nil
	case fenced:
		what = fmt.Sprintf("the record of a lock with FenceKey, such as an election's (holder %s): a Lock without FenceKey cannot share a key with it", Quote([]byte(id)))
	case bytes.HasPrefix(value, []byte(SemaphoreRecordPrefix)):
		what = "a semaphore's record, which never expires: the name is a Semaphore's"
	case bytes.HasPrefix(value, []byte(RWRecordPrefix)):
		what = "a read-write lock's record, which never expires: the name is an RWMutex's"
	case len(value) > 0 && bytes.IndexByte(value, '\n') < 0:
		if !fenceKey {
			return nil
		}
		what = "a holder's name alone: it looks like another client's lock, such as the Azure IoT Operations SDK's leased lock (or a Lock without FenceKey): " +
			"FenceKey locks and elections cannot share a key with it"
	default:
		what = "a value that no lock writes"
	}
	return &notALockError{value: value, what: what}
}

// notALockError is checkRecord's error: the key holds value, which is what.
type notALockError struct {
	value []byte
	what  string
}

func (e *notALockError) Error() string {
	return fmt.Sprintf("%v: the key holds %s, %s", ErrNotALock, Quote(e.value), e.what)
}

func (e *notALockError) Unwrap() error { return ErrNotALock }

// Quote returns v quoted for a message, cut short if long.
func Quote(v []byte) string {
	const max = 64
	if len(v) > max {
		return fmt.Sprintf("%q... (%d bytes)", v[:max], len(v))
	}
	return fmt.Sprintf("%q", v)
}
