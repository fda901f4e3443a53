package lock

import (
	"errors"

	"github.com/dsslock/dsslock/lock/internal/lease"
)

// Errors of package lock. Test for them with errors.Is: the error of a lost
// lock wraps ErrLost and the sentinel of its reason.
var (
	// ErrLost is wrapped by [Lock.Err] when the holder can no longer be sure
	// it holds the key, with the reason: ErrRenewDeadline, ErrHeldByOther,
	// ErrKeyLost, ErrFenced, ErrClosed, or ErrMaxHold when it ended by
	// its cap.
	ErrLost = lease.ErrLost
	// ErrRenewDeadline: no renewal succeeded within Config.RenewDeadline
	// (a paused process, a lost or slow connection, an overloaded store).
	// The error also carries the last renewal error, if any.
	ErrRenewDeadline = lease.ErrRenewDeadline
	// ErrHeldByOther: someone else took the key (another record, or a newer
	// token), found by a renewal, the watch (FenceKey) or a reconnect's read.
	ErrHeldByOther = lease.ErrHeldByOther
	// ErrKeyLost: the key was deleted (by hand, or in a store restart) or
	// holds this holder's record at a version it never wrote (a late request
	// of its own, which Unlock deletes): found by the watch (FenceKey) or a
	// reconnect's read, before anything more is written.
	ErrKeyLost = lease.ErrKeyLost
	// ErrMaxHold: the holding reached Config.MaxHold, and ended although
	// its renewals succeeded.
	ErrMaxHold = lease.ErrMaxHold
	// ErrFenced: a write fenced with the lock's token was refused for a
	// newer token: another holder has taken over (see [Lock.Fenced]).
	ErrFenced = lease.ErrFenced
	// ErrReleased is [Lock.Err] after Unlock or Close released the lock.
	ErrReleased = lease.ErrReleased
	// ErrNotHeld is [Lock.Err] before the first acquisition, and the error
	// of a call that needs the lock held when it is not.
	ErrNotHeld = lease.ErrNotHeld
	// ErrNotReleased is wrapped by the error of an Unlock (or Close) that
	// could not delete the key because the connection to the store was
	// lost, before or during the delete. The holding has ended all the
	// same; a key the delete did not reach expires within its TTL.
	ErrNotReleased = lease.ErrNotReleased
	// ErrAlreadyHeld: Lock or TryLock on a Lock that holds its key already.
	ErrAlreadyHeld = lease.ErrAlreadyHeld
	// ErrClosed: a call on a closed Lock, or the reason of a lock lost
	// because its Lock or its sskv.Client was closed.
	ErrClosed = lease.ErrClosed
	// ErrConfig is wrapped by every error about an invalid [Config].
	ErrConfig = lease.ErrConfig
	// ErrNotALock: Lock, TryLock or Acquire (or leader.Campaign) found the
	// key holding what will never be released to it, and acquired nothing:
	// a Semaphore's record, a record of the other FenceKey setting (an
	// election's; under FenceKey, the SDK's leased lock's), or a value no
	// lock writes. A name set by hand without expiry is waited for.
	ErrNotALock = lease.ErrNotALock
)

// Errors of a [Semaphore].
var (
	// ErrLimitMismatch: SemaphoreConfig.Limit differs from the semaphore's
	// record (the error names both), or the record key holds something
	// else. To change the limit, delete the record (sskv del NAME) while
	// nobody holds the semaphore.
	ErrLimitMismatch = errors.New("lock: semaphore limit mismatch")
	// ErrNoLimit: SemaphoreConfig.Limit is 0 and the semaphore has no
	// record to take the limit from.
	ErrNoLimit = errors.New("lock: semaphore has no record of its limit, and Limit is 0")
)
