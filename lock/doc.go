// Package lock provides leases and mutex-like locks on a key of the Azure IoT
// Operations state store, with fencing tokens, for processes that must never
// act at the same time (active/standby services, singletons, migrations), and
// counting semaphores built from them.
//
//	l, err := lock.New(client, lock.Config{Name: "orders/lock", TTL: 10 * time.Second})
//	if err != nil { ... }
//	if err := l.Lock(ctx); err != nil { ... }   // waits while someone else holds it
//	defer l.Unlock(context.Background())         // after the work below has returned
//	work(l.Context(), l.Token())                 // Context ends if the lock is lost
//
// [Acquire] is New and Lock in one call. A [Semaphore] lets up to N holders
// in at once, each in a slot that is a fenced Lock of its own:
//
//	s, err := lock.NewSemaphore(client, lock.SemaphoreConfig{Name: "fleet/firmware", Limit: 2})
//	if err := s.Acquire(ctx); err != nil { ... }   // waits while 2 others hold it
//	defer s.Release(context.Background())          // after the work below has returned
//	work(s.Context(), s.Slot(), s.Token())         // Context ends if the slot is lost
//
// A Lock takes its key with SET NEX PX (its HolderID as value, the TTL as
// expiry); the version the store returns is the holding's fencing token. It
// renews the key every RenewInterval and deletes it at Unlock with VDEL, only
// if it still holds its HolderID. Waiters sleep on notifications (KEYNOTIFY)
// and queue in the order they came; with [Config.Race] they race for each
// release instead, as the Azure IoT Operations SDK's do. With
// [Config.FenceKey] the key also records the token and a published value
// ([Lock.Holder], [Lock.SetValue]), and the holder watches it. Package leader
// builds on this; package fenced writes other keys with the token.
//
// # Guarantees
//
//   - Never "held" without holding. Lock and TryLock succeed only after the
//     store applied this Lock's SET and answered within RenewDeadline. An
//     acquisition whose outcome is unknown (timeout, lost connection) is
//     retried with the same value or, once the caller gives up, undone with
//     VDEL: nothing is left behind for longer than one TTL.
//   - Lost is decided by the holder, on its own monotonic clock, before the
//     store can expire the key. With no successful renewal within
//     RenewDeadline of sending the last one, Done closes, Context is
//     cancelled and Err wraps [ErrLost] and [ErrRenewDeadline]; the work then
//     has at least TTL - RenewDeadline to stop. A renewal that finds another
//     holder ([ErrHeldByOther]), a fenced write refused for a newer token
//     ([ErrFenced]) and, with FenceKey, a key deleted behind the holder's
//     back ([ErrKeyLost]) end the holding at once. FencingToken checks the
//     deadline itself, so a process that wakes from a pause finds the lock
//     lost before its first write.
//   - Release only after the guarded work has returned: a lost lock never
//     deletes its key by itself. Call Unlock once the work has returned.
//   - Fencing tokens increase strictly from one holder to the next; renewals
//     keep a holding's token.
//   - A holding never outlives its key. After a reconnect, or a Resync of its
//     watch, the holder reads its key before it writes again: a missing key,
//     another version or another holder ends the holding (ErrKeyLost,
//     ErrHeldByOther). Its requests are never sent again on a later
//     connection; fenced writes wait for that read ([Lock.FencingConn]).
//   - A waiter never takes a key someone may still believe they hold: no
//     acquisition goes out within a TTL of a reconnect of the client (TryLock
//     reports false meanwhile), nor within a TTL of a Resync that finds
//     missing a key the waiter had seen held, except a key a FenceKey release
//     reserved for this waiter. Otherwise a release or expiry is taken at once.
//   - Order: queued waiters are served in the order they came; a Lock call,
//     or a Semaphore's Acquire, is overtaken about 2N times at most with N
//     others waiting. A TryLock, or a Lock that found the lock free, can slip
//     in only between a release and the first waiter's take-over.
//   - A key that will never be released to this lock fails Lock, TryLock and
//     Acquire at once with [ErrNotALock], naming what it holds: a Semaphore's
//     record, a record of the other FenceKey setting (an election's; under
//     FenceKey, the SDK's leased lock), or a value no lock writes. A Lock
//     without FenceKey shares a key with the SDK's leased lock.
//   - A request the store refuses (a *sskv.ServiceError, such as
//     sskv.ErrTimestampSkew) ends a wait at once; timeouts and lost
//     connections are retried.
//   - A Semaphore never has more than N holders: each holds one of the slots
//     0 to N-1, each slot a FenceKey Lock. Tokens of different slots are not
//     ordered against each other: fence per slot. N is the record's; a
//     participant whose Limit differs fails with [ErrLimitMismatch].
//
// # What it assumes, and does not guarantee
//
//   - The clocks of holder and store run at about the same rate (any
//     NTP-kept clock does): TTL - RenewDeadline must exceed their difference
//     over a TTL.
//   - A lease is only as good as the holder's reaction to Done: work that
//     ignores its context can run on after another holder took over. Fencing
//     keeps its writes out of the keys it protects, not its effects elsewhere.
//   - Lock keys live in the store's memory. A store restart ends every
//     holding (ErrKeyLost once the holder reconnects, ErrRenewDeadline if it
//     cannot), and the lock is free again about a TTL after the waiters
//     reconnect. A process whose first connection comes just after a restart
//     may take the key at once, before the former holder has reconnected;
//     that holder's fenced writes wait for its read, and so never go out.
//     Keys written with a token keep their fence only while they exist:
//     persist those that must survive a restart.
//   - A key deleted by hand is re-created by the holder's next renewal
//     without FenceKey, and with FenceKey too if the deletion crosses a
//     renewal held up in the network. Do not delete a held lock's key.
//
// # Costs
//
// Measured on the local store; docs/benchmarks.md has the commands.
//
//	TryLock, or Lock of a free lock   1 request (2 with FenceKey)
//	Unlock                            1 request
//	holding                           1 renewal per RenewInterval, sent with the client's
//	                                  other renewals; no goroutine or timer per Lock
//	entering a contended Lock         9 requests (5 with Race)
//	waiting while the holder renews   no requests; about 1.25 KB (1.0 KB for Acquire with Race)
//	handover to the next waiter       about 4 requests, a few ms
//	takeover after a holder crashed   about TTL after its last renewal
//	Semaphore Acquire and Release     4 requests when a slot is free
//
// A Semaphore participant that held or waited within a TTL queues even when
// a slot is free, and beside a holder of slot 0 that keeps no queue waits
// about TTL/10 (at most 1 s) for it. docs/design/lock.md describes the queue,
// the racing waiter and the semaphore, and the designs they replaced.
//
// # Configuration
//
// TTL, RenewInterval and RenewDeadline must satisfy 0 < RenewInterval <
// RenewDeadline < TTL, in whole milliseconds; the defaults are 10 s, TTL/3
// and 2/3 TTL. A shorter TTL speeds up the takeover after a crash but leaves
// less room for pauses; an Unlock hands over at once whatever the TTL.
package lock
