// Package lease is the lowest of package lock's three floors: the lease
// core of one holder of a key. It imports neither floor above it (package
// wait, the wait policies, and package lock, the face).
//
// A [Lease] makes acquisitions (SET NEX PX, and with FenceKey the fenced
// second SET, with the undo of an attempt whose outcome is unknown), and
// keeps what one starts, a holding, until it is lost or released:
// renewals by the client's renewer (one request per RenewInterval, one
// goroutine per client), the renew deadline on the holder's own monotonic
// clock, the confirmation of the key before the first write after a
// reconnect or a Resync, and with FenceKey a guard that watches the key.
// Release deletes the key (VDEL) after the work has returned, or with a
// wait queue hands it to the queue's first waiter through [Queue].
//
// It also keeps the Lease's turn, which orders its acquisitions and
// releases, and the calls in progress, which Close ends. Everything here
// is internal: lock.Lock documents the guarantees.
package lease
