package lock

import "errors"

// Errors of package lock. Test for them with errors.Is: the error of a lost
// lock wraps ErrLost and the sentinel of its reason.
var (
	// ErrLost is wrapped by [Lock.Err] when the holder can no longer be sure
	// it holds the key, with the reason: ErrRenewDeadline, ErrHeldByOther,
	// ErrKeyLost, ErrFenced, ErrClosed, or ErrMaxHold when it ended by
	// its cap.
	ErrLost = errors.New("lock: lost")
	// ErrRenewDeadline: no renewal succeeded within Config.RenewDeadline
	// (a paused process, a lost or slow connection, an overloaded store).
	// The error also carries the last renewal error, if any.
	ErrRenewDeadline = errors.New("lock: renew deadline passed")
	// ErrHeldByOther: someone else took the key (another record, or a newer
	// token), found by a renewal, the watch (FenceKey) or a reconnect's read.
	ErrHeldByOther = errors.New("lock: held by another holder")
	// ErrKeyLost: the key was deleted (by hand, or in a store restart) or
	// holds this holder's record at a version it never wrote (a late request
	// of its own, which Unlock deletes): found by the watch (FenceKey) or a
	// reconnect's read, before anything more is written.
	ErrKeyLost = errors.New("lock: the key changed behind the holder's back")
	// ErrMaxHold: the holding reached Config.MaxHold, and ended although
	// its renewals succeeded.
	ErrMaxHold = errors.New("lock: held for MaxHold")
	// ErrFenced: a write fenced with the lock's token was refused for a
	// newer token: another holder has taken over (see [Lock.Fenced]).
	ErrFenced = errors.New("lock: a newer fencing token protects a key")
	// ErrReleased is [Lock.Err] after Unlock or Close released the lock.
	ErrReleased = errors.New("lock: released")
	// ErrNotHeld is [Lock.Err] before the first acquisition, and the error
	// of a call that needs the lock held when it is not.
	ErrNotHeld = errors.New("lock: not held")
	// ErrNotReleased is wrapped by the error of an Unlock (or Close) that
	// could not delete the key because the connection to the store was
	// lost, before or during the delete. The holding has ended all the
	// same; a key the delete did not reach expires within its TTL.
	ErrNotReleased = errors.New("lock: not released: the connection to the store was lost")
	// ErrAlreadyHeld: Lock or TryLock on a Lock that holds its key already.
	ErrAlreadyHeld = errors.New("lock: already held by this Lock")
	// ErrClosed: a call on a closed Lock, or the reason of a lock lost
	// because its Lock or its sskv.Client was closed.
	ErrClosed = errors.New("lock: closed")
	// ErrConfig is wrapped by every error about an invalid [Config].
	ErrConfig = errors.New("lock: invalid config")
	// ErrNotALock: Lock, TryLock or Acquire (or leader.Campaign) found the
	// key holding what will never be released to it, and acquired nothing:
	// a Semaphore's record, a record of the other FenceKey setting (an
	// election's; under FenceKey, the SDK's leased lock's), or a value no
	// lock writes. A name set by hand without expiry is waited for.
	ErrNotALock = errors.New("lock: not a lock")
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
