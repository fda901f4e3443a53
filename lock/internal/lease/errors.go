package lease

import "errors"

// The errors of package lock, which exports them (see there for what each
// means): they are made here, so that the lease core returns the same values.
var (
	ErrLost          = errors.New("lock: lost")
	ErrRenewDeadline = errors.New("lock: renew deadline passed")
	ErrHeldByOther   = errors.New("lock: held by another holder")
	ErrKeyLost       = errors.New("lock: the key changed behind the holder's back")
	ErrMaxHold       = errors.New("lock: held for MaxHold")
	ErrFenced        = errors.New("lock: a newer fencing token protects a key")
	ErrReleased      = errors.New("lock: released")
	ErrNotHeld       = errors.New("lock: not held")
	ErrNotReleased   = errors.New("lock: not released: the connection to the store was lost")
	ErrAlreadyHeld   = errors.New("lock: already held by this Lock")
	ErrClosed        = errors.New("lock: closed")
	ErrConfig        = errors.New("lock: invalid config")
	ErrNotALock      = errors.New("lock: not a lock")
)
