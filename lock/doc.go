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
// A Lock takes its key with SET NEX PX; the version the store returns is the
// holding's fencing token, for package fenced. It renews the key every
// RenewInterval and deletes it at Unlock. Waiters sleep on notifications and
// queue in the order they came, or race ([Config.Race]). With
// [Config.FenceKey] the key also records the token and a published value.
// A racing FenceKey holder may hand the lock to a named waiter
// ([Lock.UnlockTo]): one fenced SET reserves the key for it, and it takes
// the key at once, nobody in between (the reservation expires after the
// TTL if that waiter has gone).
//
// # Guarantees
//
//   - Never "held" without holding: Lock and TryLock succeed only once the
//     store applied this Lock's SET and answered within RenewDeadline. An
//     acquisition whose outcome is unknown is retried or, once the caller
//     gives up, undone with VDEL: nothing is left behind longer than a TTL.
//   - Lost is decided by the holder, on its own monotonic clock, before the
//     store can expire the key: with no renewal within RenewDeadline, Done
//     closes, Context is cancelled and Err wraps [ErrLost] and
//     [ErrRenewDeadline]; the work then has at least TTL - RenewDeadline to
//     stop. Another holder ([ErrHeldByOther]), a newer token ([ErrFenced])
//     or, with FenceKey, a deleted key ([ErrKeyLost]) ends it at once.
//     FencingToken checks the deadline itself, before any write.
//   - A lost lock never deletes its key by itself: call Unlock once the
//     guarded work has returned. Unlock and Close still try for a second of
//     their own if their context has ended already. Tokens increase
//     strictly from one holder to the next; renewals keep a holding's token.
//   - With Config.MaxHold (or SemaphoreConfig.MaxHold, RWMutexConfig.MaxHold),
//     a holding ends as lost ([ErrMaxHold]) that long after it was taken,
//     even while its renewals succeed.
//   - A holding never outlives its key: after a reconnect or a Resync the
//     holder reads its key before it writes again, and a missing or changed
//     key ends the holding. Its requests are never sent again on a later
//     connection; fenced writes wait for that read ([Lock.FencingConn]).
//   - A waiter never takes a key someone may still believe they hold: within
//     a TTL of a reconnect of the client, or of a Resync that finds missing a
//     key it had seen held, it takes none (TryLock reports false), except one
//     a FenceKey release reserved for it. Otherwise a release or expiry is
//     taken at once.
//   - Order: queued waiters are served in the order they came; a Lock call,
//     or a Semaphore's Acquire, is overtaken about 2N times at most with N
//     others waiting. A TryLock, or a Lock that found the lock free, can slip
//     in only between a release and the first waiter's take-over.
//   - A key that will never be released to this lock ends a wait at once
//     ([ErrNotALock]), as does a request the store refuses (a
//     *sskv.ServiceError). A Lock without FenceKey shares a key with the
//     Azure IoT Operations SDK's leased lock.
//   - A Semaphore never has more than N holders, one per slot, each slot a
//     FenceKey Lock, whatever befalls the gate its waiters queue on. Tokens
//     of different slots are not ordered: fence per slot. N is the
//     record's; a different Limit fails ([ErrLimitMismatch]).
//   - An [RWMutex] has many readers or one writer, each holding a Lock's
//     (a reader slot's, or the gate's for a writer). Readers that come after
//     a waiting writer wait behind it. A writer's token is newer than every
//     holding's, read or write, that ended before it began
//     (docs/design/rwmutex.md).
//
// # What it assumes, and does not guarantee
//
//   - The clocks of holder and store run at about the same rate (any
//     NTP-kept clock does): TTL - RenewDeadline must exceed their difference
//     over a TTL.
//   - A lease is only as good as the holder's reaction to Done: work that
//     ignores its context can run on after another holder took over. Fencing
//     keeps its writes out of the keys it protects, not its effects elsewhere.
//   - Unless the store persists every key (localstore's PersistAll, the
//     service's mode All: holders then confirm their key and go on), a
//     store restart loses lock keys and ends every holding; the lock is
//     free again about a TTL after the waiters reconnect. A process whose
//     first connection comes just after a restart may take the key before
//     the former holder has reconnected; that holder's fenced writes wait
//     for its read, and so never go out. Persist the keys written with a
//     token that must survive a restart.
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
//	holding                           1 renewal per RenewInterval; no goroutine or timer
//	entering a contended Lock         9 requests (3 with Race)
//	waiting while the holder renews   no requests; about 1.25 KB (1.0 KB for Acquire with Race)
//	handover to the next waiter       about 4 requests, a few ms
//	UnlockTo a racing waiter          3 requests (the reservation, the waiter's 2 SETs), about 1 ms
//	takeover after a holder crashed   about TTL after its last renewal (Config)
//	Semaphore Acquire and Release     4 requests when a slot is free
//	RWMutex RLock and RUnlock         about 7 requests; Lock and Unlock about 6 + MaxReaders
//
// A Semaphore participant that held or waited within a TTL first reads the
// semaphore's gate (one GET), and queues on it if anyone waits there, even
// when a slot is free. The participant holding the gate renews it while it
// waits for a slot; if it is paused, the waiters behind it wait until its
// lease of the gate ends. docs/design/lock.md describes the queue, the
// racing waiter and the semaphore, and the designs they replaced.
package lock
