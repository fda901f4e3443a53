package lock

import (
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock/internal/lease"
)

// Holder is who holds a lock, as the store has it.
type Holder struct {
	// ID is the holder's HolderID; empty when the lock is free.
	ID string
	// Token is the holder's fencing token (with FenceKey; zero without, and
	// while an acquisition is under way).
	Token   hlc.Timestamp
	Value   []byte        // what the holder publishes; nil without FenceKey
	Version hlc.Timestamp // the key's version; zero when the lock is free
}

// Held reports whether anyone holds the lock.
func (h Holder) Held() bool { return h.ID != "" || !h.Version.IsZero() }

// ParseHolder reads the value and version of a lock's key as a Holder. A
// key written with Config.FenceKey holds HolderID "\n" token "\n" Value (an
// acquisition under way writes "~" and a nonce in place of the token); any
// other value is a HolderID alone, and nil a free lock.
func ParseHolder(value []byte, version hlc.Timestamp) Holder {
	return Holder(lease.ParseHolder(value, version))
}
