// Package lock provides leases and mutex-like locks on a key of the Azure IoT
// Operations state store, with fencing tokens, for processes that must never
// act at the same time (active/standby services, singletons, migrations).
//
//	l, err := lock.New(client, lock.Config{Name: "orders/lock", TTL: 10 * time.Second})
//	if err != nil { ... }
//	if err := l.Lock(ctx); err != nil { ... }   // waits while someone else holds it
//	defer l.Unlock(context.Background())         // after the work below has returned
//	work(l.Context(), l.Token())                 // Context ends if the lock is lost
//
// [Acquire] is New and Lock in one call, for a standby that has no use for
// the Lock before it holds.
//
// # How it works
//
// A Lock is one holder, identified by its HolderID. It acquires the key with
// SET NEX PX: the key is created with the HolderID as value and the TTL as
// expiry, unless someone else holds it. The version the store returns is the
// holding's fencing token. While it holds the key, the Lock renews it every
// RenewInterval with the same SET (NEX lets only the current holder renew).
// Unlock stops the renewals and deletes the key with VDEL, which deletes it
// only if it still holds this HolderID.
//
// A holding writes its key only through the connection on which it last
// saw it (an sskv.Conn), and knows the version of its last write. When that
// connection is lost, it reads the key as soon as the client has
// reconnected, and goes on only if the key is still at that version: a SET
// NEX renewal would otherwise re-create a key that vanished meanwhile (in a
// store restart, say) after another holder may have held it in between.
//
// The renewals of all the Locks of one sskv.Client are sent by one
// scheduler, which sleeps on one timer until the next renewal or renew
// deadline is due: a held lock costs no goroutine and no timer of its own,
// and a renewal in flight holds up no other. The first renewal of a holding
// falls at random in the second half of RenewInterval, and later ones up to
// a tenth of it late, so that locks taken together do not renew together
// while a holding still renews, on average, no more often than
// RenewInterval asks. Renewals due within a thirtieth of RenewInterval (at
// most 100 ms) of one that is due go out with it, as one burst (so up to
// that much early): that costs the client and the store less than the same
// requests one at a time. At most 256 renewals of
// a client are in flight at once; when more are due (every holding after a
// reconnect, each confirming its key and then renewing), they wait in
// order of their renew deadlines, so that those closest to it go first:
// BenchmarkReconnect cuts the connection of a client holding 20,000 locks,
// and none is lost.
//
// # Waiting, and the order of waiters
//
// A Lock that waits ([Lock.Lock]) sends no request while the holder keeps
// renewing; a free lock costs one request. Waiters queue in the order they
// came, with the primitives the state store has (no list, scan or
// compare-and-swap), and without telling every waiter of every change:
//
//   - The holder keeps the queue, in memory. Each Lock in a queue watches
//     its own inbox key (Name + "\x00inbox\x00" + HolderID), and the others
//     tell it things with a SET of that key; messages expire after 10 TTLs.
//   - A waiter reads the lock's key to learn the holder and joins by writing
//     its record into the holder's inbox. The holder confirms the join, or
//     tells the waiter to watch the lock's key.
//   - Only two waiters watch the lock's key (KEYNOTIFY), and a waiter whose
//     join is not confirmed yet: the holder may keep no queue (it took a
//     free lock without waiting, or with TryLock), and then the waiter
//     races for the release and joins whoever won. The holder picks the two
//     from the back of the queue, and they watch until they hold, so that a
//     handover seldom needs a new one.
//   - A release hands the queue to the first waiter with one message: with
//     the delete if that waiter watches the key (it takes the key once it
//     has seen both), else after the delete's answer (or, with FenceKey,
//     after a fenced SET of that waiter's record: a reservation that only it
//     can take). It takes the lock and keeps the queue from then on. A
//     holder that locks again at once joins at the back, with one message
//     to the Lock it handed to.
//   - If the holder is gone (the key expired), the first waiter takes the
//     key at once, whatever the length of the queue: a watcher is told who
//     is ahead of it when it is told to watch, drops those it sees take the
//     key, and at the expiry takes the key if it is the first, or else
//     tells the first (one message from each watcher; a Lock told that no
//     longer waits tells the next, and the holder tells the watchers when a
//     waiter ahead of them leaves the queue, one message each). A watcher
//     takes the key itself after a grace (TTL/10, at most 1 s), in case the
//     first is gone too. A Lock
//     that took the key without being handed the queue calls a roll on the
//     queue key (Name + "\x00queue"), which every Lock in a queue watches,
//     and a waiter missing from it joins again: that costs a notification
//     per waiter, after faults only.
//
// The bound: a Lock call is overtaken about 2N times at most, with N other
// Locks waiting. A confirmed waiter is served in order, so each other
// waiter overtakes it at most once, and at most once more if the queue is
// lost (a crash) or it was not confirmed yet when a release sent everyone
// to the store. Under load, messages cross: a join reaches a Lock that has
// just handed the queue on, a turn comes after its receiver took the key
// through its reservation, or another took the key the turn was for. Each
// such queue is merged into the holder's (turns carry the releasing
// holding's token, so a late one is told apart), so that two queues never
// wait on each other. Measured with 10 waiters holding 5 ms each, race
// detector, on a loaded 2-core machine (TestFairWaiting): at most 10-22
// overtakes, median 16, in 15 runs with the machine's load average at 2.5-5,
// interleaved with the design in which the first two waiters watched the
// key (14-21, median 16); in earlier runs of the same kind, 8-23 in most of
// about 75, 26 and 28 once each at a load average of 5-7, and 32 once near
// 8, past the 3N the tests check. Locks that take a free lock without
// queueing (TryLock, or a Lock that found the lock free) can take it only
// in the moment between a release and its take-over by the first waiter;
// a FenceKey handover leaves no such moment. Config.Race turns the queue off:
// waiters then race for each release, as the SDK's do (package leader does
// this for an election's few candidates). A racing waiter asleep while the
// holder renews has no goroutine but its caller's, and no timer: it holds
// its watch of the key, its place in its client's schedule of safeguard
// checks, and (in a Lock call) its Lock and its call's context; the timers
// and backoffs of retries and lost races are made only when needed.
// [Acquire] waits with no Lock at all until it holds, and no context of its
// own: about 1.0 KB per waiter (1.25 KB in a Lock call), which is how an
// election's followers wait.
//
// Costs, measured with BenchmarkWaiters (each holder holds 20 ms, and locks
// again once another has the lock): 4 requests per handover (the release,
// the turn, the take-over, the old holder's join), and about as many
// notifications, plus 4 when a watcher of the key takes the lock (telling a
// new one, its KEYNOTIFY and GET, the new holder's KEYNOTIFY STOP): about 2
// in N handovers with N waiters, so 4.8-5.6 requests per handover with 10
// waiters, 4.1 with 100 and 4.0 with 400; handover p50 1.7-3.5 ms with 10
// waiters and 2-3.2 ms with 400 (in three runs interleaved with the design
// before, in which the first two waiters watched the key: 8 requests,
// 1.9-2.3 ms and 2.1-2.6 ms). A handover to a waiter that watches the key (the only
// waiter, say) costs what a race for the release would: the turn goes out
// with the delete. A crashed holder's key costs one message more from each
// watcher, to the first waiter, which takes it about a millisecond after
// the expiry (p50 0.9-1.1 ms with 3 or 10 waiters,
// BenchmarkCrashTakeoverQueue; with the first two waiters watching, one of
// them took it after the grace, 21 ms there, as often the second as the
// first). A contended Lock costs 9 requests to enter the wait. When many
// wait behind a holder that keeps no queue (it took a free lock), its
// release sends all of them to the store once, and they queue behind the
// winner in the order they come back: that is where a Lock call comes
// nearest the 2N bound.
//
// After a reconnect the watches report that they may have missed changes
// and the waiter checks at once; as a last safeguard it also checks after
// 10 TTLs without news. A timeout or a lost connection is retried; a request
// the store refuses (a *sskv.ServiceError: a clock more than a minute ahead
// of the store's, sskv.ErrTimestampSkew, or no authorisation) ends the wait
// at once with that error, since it would be refused again.
//
// # Fenced keys and published values
//
// With Config.FenceKey, each holding also fences the lock's own key with its
// token (a second SET right after the one that takes the key) and records
// the token and a published value (Config.Value) in it, as
// "HolderID\ntoken\nvalue". [Lock.Holder] and [ParseHolder] then report
// who holds the lock, since which token, and what it publishes, and
// [Lock.SetValue] changes the value without releasing the lock. The fence is
// what makes changing the value safe: the store refuses any write carrying
// an older token, so a request of an earlier holding that arrives late can
// never overwrite the current holder's record. A FenceKey holder also
// watches its key (a callback watch, sskv.Client.WatchFunc, or the waiter's
// watch handed off to one: no goroutine), and its holding ends as lost the moment the key is
// deleted behind its back (ErrKeyLost) or taken by another holder
// (ErrHeldByOther); when the watch reports that it lost track of the key (a
// Resync), the holder reads the key at once. Without FenceKey a deletion by
// hand on a live connection goes unnoticed until the next renewal, which
// re-creates the key; a store restart is caught either way, by the read
// after the reconnect. Package leader builds on this.
//
// # Keys that are never released
//
// A waiter looks at what holds the key before it waits on it (the read
// that finds the holder; for a racing waiter, one read once its watch is
// on, and the notifications after it; TryLock reads it when it finds the
// key held), and fails at once, with an error wrapping [ErrNotALock] that
// says what the key holds, when nothing will ever release it to this lock:
// a Semaphore's record, which never expires; the record of a lock with the
// other FenceKey setting (an election's, under a Lock without FenceKey; a
// holder's name alone, under a FenceKey lock, such as the record of the
// Azure IoT Operations SDK's leased lock, which cannot share a key with
// FenceKey locks: an SDK Lock against a fenced key is refused rather than
// wait, and a FenceKey handover never wakes SDK waiters); or a value that
// no lock writes (several lines, or empty). A Lock without FenceKey does
// share a key with the SDK's leased lock: both write the holder's name
// with an expiry, exclude each other, and wake on each other's release.
// The store does not say whether a key expires, so a value is judged by
// what it is: a name set by hand without expiry on a Lock without
// FenceKey looks like a holder's, and is waited for. The read costs a
// racing waiter one request at entry (5 in all), a queued one nothing. A
// key overwritten so during a wait ends a racing waiter's at once (the
// notification), and a queued waiter's at its next read of the key: at the
// latest its safeguard check, 10 TTLs on.
//
// # Guarantees
//
// The rules, learnt from the outages of other lock services:
//
//   - Never "held" without holding. Lock and TryLock return success only
//     after the store has applied this Lock's SET, and only if its answer
//     came back within RenewDeadline of sending it, which is also as long
//     as an acquisition waits for its answer. An acquisition whose
//     outcome is unknown (timeout, lost connection) is either retried with
//     the same value (harmless if the first one applied) or, when the
//     caller gives up, undone with VDEL: no key is left behind for longer
//     than one TTL, even if the store applies the SET after the caller left.
//   - Lost is decided by the holder, on its own monotonic clock, before the
//     store can expire the key. If no renewal succeeds within RenewDeadline
//     of sending the last successful one, the holding ends: Done closes,
//     Context is cancelled, and Err wraps ErrLost and ErrRenewDeadline. The
//     store keeps the key for at least TTL - RenewDeadline more, which is
//     the time the holder's work has to stop. A renewal that finds another
//     holder ends it at once (ErrHeldByOther), and so does a fenced write
//     that finds a newer token (ErrFenced, through package fenced).
//     FencingToken checks the deadline itself, so a process that wakes from
//     a pause past it finds the lock lost before its first write.
//   - Release only after the guarded work has returned. The Lock never
//     deletes its key on its own when the lock is lost: a holder that merely
//     believes it lost the lock may still be running its work. The key then
//     expires after the TTL, unless Unlock deletes it earlier. Call Unlock
//     after the work has returned.
//   - Fencing tokens increase strictly from one holder to the next, because
//     the store's versions do. Renewals do not change a holding's token, so
//     a holder's own earlier fenced writes never make its later ones fail.
//   - A holding never outlives its key. Whatever a holder may have missed
//     (a reconnect, a Resync of its watch, a store restart, a request of
//     its own delivered late) is confirmed before it writes again: after a
//     reconnect it reads its key, and a missing key, another version or
//     another holder ends the holding as lost (ErrKeyLost,
//     ErrHeldByOther), with Done and Context as for any loss. A record of
//     its own that a late request of its wrote is deleted by Unlock, once
//     the work has returned. Requests of a holding are never sent again on
//     a later connection (see sskv.Conn), and a request whose caller gave
//     up is never sent again at all. Fenced writes (package fenced, on the
//     Lock's client) wait for that confirmation too, and go out on the
//     same connection (FencingConn).
//   - A waiter never takes a key that someone may still believe they hold.
//     The store may have restarted, and lost the key, while the client was
//     disconnected, with its holder, cut off, still counting on it until
//     its renew deadline. So no acquisition goes out within a TTL of a
//     reconnect of the client, whichever Lock or Campaign makes it and
//     whatever it saw before (TryLock reports false meanwhile), nor within
//     a TTL of a Resync of a waiter's watch that finds missing a key the
//     waiter had seen held. Otherwise a release or an expiry a waiter sees
//     (a DELETE notification) is taken at once. One exception to the
//     reconnect's TTL: a key a FenceKey release reserved for this Lock (or
//     a Semaphore's keeper, for this participant), which a read on the new
//     connection finds still reserved, is taken at once. It has not
//     vanished, and nobody else counts on it.
//
// # Store restarts
//
// The state store keeps lock keys in memory: a broker restart or upgrade
// loses them (the library never asks for them to be persisted). What holds
// then: the holder finds its key gone as soon as it has reconnected, and its
// holding ends (ErrKeyLost) with its work's context cancelled, well before
// its renew deadline if the store comes back quickly, by the deadline
// otherwise; waiters take the lock about a TTL after they reconnect; no two
// holders overlap meanwhile, and tokens keep increasing (the restarted
// store's versions come from its clock). What it costs: a restart ends every
// holding, and the lock is free again only a TTL later (measured with a 2 s
// TTL: the waiter held it 2.2 s after the store went down).
//
// If the lock's key were persisted (the service's aio-persistence), it
// would survive the restart: the holder would find it at its version and go
// on, and waiters would find it held, so a restart would cost nothing but
// the reconnect. The keys a holder writes with its fencing token (package
// fenced) carry their token only as long as they exist: persist the ones
// that must survive a restart (sskv.SetOptions.Persist), or a restart loses
// their fence with them.
//
// A process that started while the store was down holds off too (its first
// connection came after failed attempts). What no client can know: a
// process whose first connection succeeds at once, just after a store
// restart, finds the key missing and takes it at once. Until the former
// holder has reconnected and read its key (its reconnect delay after the
// store is back), both may act; the former holder's fenced writes (package
// fenced, on its lock's client) wait for that read, and so never go out.
//
// What it does not guarantee: a lease is only as good as the holder's
// reaction to Done. Work that ignores its context can still run after the
// lock passed to another holder; fencing (package fenced) then keeps its
// writes out of the keys it protects, but not its effects elsewhere. The
// clocks of holder and store must run at about the same rate (any NTP-kept
// clock does): TTL - RenewDeadline must exceed their difference over a TTL.
// A key deleted by hand while a renewal of its holder is held up in the
// network is re-created by that renewal when it arrives, and the holder
// goes on: the store answers a SET NEX the same whether it renewed the key
// or created it, and the deletion's notification may be held up with the
// renewal. Nobody can have held the key in between without the renewal
// failing (NEX), which ends the holding. Do not delete a held lock's key by
// hand; a store restart, which ends the connection, is always caught.
//
// # Semaphores
//
// A [Semaphore] lets up to N holders in at once ("at most 2 replicas
// upgrade their firmware"), as Consul's api.Semaphore or Curator's
// semaphore, with each holding fenced. Each of its N slots is a key held by
// a Lock with FenceKey (Name + "\x00slot\x00" + i), so a slot's lease,
// renewals, renew deadline, loss, fencing and release are exactly a Lock's,
// and its holder writes through package fenced with the slot's token. A
// record key, Name, holds N ("dsslock-semaphore limit=3"), written once
// with SET NX by the first participant, without expiry.
//
//	s, err := lock.NewSemaphore(client, lock.SemaphoreConfig{Name: "fleet/firmware", Limit: 2})
//	if err := s.Acquire(ctx); err != nil { ... }   // waits while 2 others hold it
//	defer s.Release(context.Background())          // after the work below has returned
//	work(s.Context(), s.Slot(), s.Token())         // Context ends if the slot is lost
//
// What holds: never more than N holders, under the same conditions as a
// Lock's single holder (clocks that run at about the right rate, work that
// stops when its Context ends), because each holder holds one of the
// slots 0 to N-1, and each slot has at most one holder; and each holder's
// fenced writes carry its slot's token, which the store refuses once the
// slot has a newer holder. Tokens of different slots are not ordered
// against each other: fence per slot (a key per slot, say), or keys that
// holders of several slots write may take a write of a holder that lost
// its slot after one of another slot's newer holder.
//
// N is the record's. A participant whose SemaphoreConfig.Limit differs
// cannot acquire: Acquire and TryAcquire fail with ErrLimitMismatch, naming
// both values, rather than use more (or fewer) slots than the others; one
// with Limit 0 takes the record's (ErrNoLimit if there is none). The
// record never changes by itself: to change N, stop the participants (or
// let them release), delete the record ("sskv del NAME"), and start them
// with the new Limit. Holders of slots beyond a smaller new N would keep
// them until they release, so change it only while nobody holds.
//
// Acquiring reads the record. A participant that has neither held nor
// waited within a TTL then tries each slot once (TryLock, from a random
// one), which takes a free slot at once: free, an Acquire and its Release
// cost 4 requests (the GET, the SET NEX PX and the fenced SET of FenceKey,
// the VDEL) and the holding's watch of its key (KEYNOTIFY, and KEYNOTIFY
// STOP at the release): BenchmarkSemaphore counts 5 reaching the store,
// 1.1-2 ms for the pair on the local store.
//
// Otherwise, or if every slot is held, it waits in the semaphore's one
// queue, slot 0's, which is a Lock's queue (see above), so waiters are
// served in the order they came whichever slot is released. The holder of
// slot 0 keeps the queue; while anyone waits, it also watches the other
// slots, and when one is released (a plain VDEL: they keep no queue) or
// expires, it reserves it for its first waiter (SET NX of that waiter's
// acquisition record, with the TTL, fenced with its own token of slot 0),
// takes the waiter out of the queue and tells it, and the waiter takes the
// slot as a Lock takes a key reserved for it (fenced with the
// reservation's version). Being fenced, a reservation can be taken only
// that way: the waiter's own attempts on the slot, which write the same
// record, cannot take it unfenced. It is deleted only by the one it was
// for (a Lock's or a participant's, when an offer or a turn comes after it
// stopped waiting: the holder that made it tells it even if it has left),
// with a VDEL fenced as well and run with the turn of the Lock that writes
// that record. A message may reach the store long after it was sent (its
// path froze), after the reservation expired and that Lock's own
// acquisition recreated the key with the same record; only that Lock can
// keep the VDEL out of its acquisition's two SETs. Slot 0 itself goes to the first waiter at its holder's release,
// as a Lock's key. A waiter sends nothing while the holders renew; the
// holder of slot 0 pays for the watches (a KEYNOTIFY per other slot when
// someone starts waiting, and a SET NX and a message per slot it passes
// on, and one more to each watcher of slot 0's key behind the waiter it
// passes it to: see the Lock's queue above).
//
// The bound is a Lock's: a waiter whose join is confirmed is overtaken by
// each other participant at most once, or twice if the queue was lost and
// it joined again, so at most 2N times with N other participants. Outside
// it: a participant that comes after a TTL without holding or waiting may
// take a slot freed in the moment between its release and the holder of
// slot 0's reservation (one notification and one round trip); and the
// waiters of a holder of slot 0 that keeps no queue (it took slot 0 while
// free, without waiting) get no confirmation, so after a grace each
// watches the other slots itself and takes one that is freed, in no
// particular order, until a waiter takes slot 0 and starts the queue.
// Measured (10 participants on their own clients, N = 3, each holding 3
// ms and acquiring again at once, 300 acquisitions, race detector, on a
// 2-core machine at load 6-9): the Acquire overtaken most was overtaken
// 10-20 times in 20 runs, against 2N = 20; one waiting in one random
// slot's queue, the design before, gave 39-61.
//
// Within slot 0's queue, a waiter that comes back after its release finds
// the holder with a GET rather than join the Lock it handed slot 0 to (as
// a Lock's waiter does), since that one may have taken another slot and
// moved on; and a waiter given others' entries passes them to the holder
// it joined.
//
// A reservation for a waiter that no longer waits is deleted by that
// waiter (the message reaches its queue, which lingers a TTL after a
// wait); one made as it closes, after its queue ended, expires after the
// TTL, and the slot goes to the next waiter then.
//
// The price of the order: a participant that held within a TTL goes to
// the queue even when a slot is free. If slot 0's holder keeps no queue
// (it took slot 0 while free) it confirms nothing, and the participant
// takes the free slot only after the grace above (TTL/10, at most 1 s):
// BenchmarkSemaphoreBesideHolder, which acquires and releases in a loop
// beside such a holder, measures 0.8 s per round trip with the default
// TTL, where a participant idle for a TTL takes a free slot at once.
// A shorter grace, making such holders keep the queue, and trying free
// slots first unless the participant waited lately were tried: in the
// combinations measured, some waiter was overtaken 90 to 290 times on a
// loaded machine, so they were left out.
//
// Another cost of one queue: the other slots pass to waiters through the
// holder of slot 0. While that holder is paused (a stop-the-world pause, a
// frozen VM), a slot released meanwhile stays free until the holder wakes
// or its lease ends (a TTL at most), when the first waiter takes slot 0
// and the other slots with it. Safety does not depend on it: each slot is
// a fenced Lock.
//
// # Configuration
//
// TTL, RenewInterval and RenewDeadline must satisfy 0 < RenewInterval <
// RenewDeadline < TTL, in whole milliseconds; the defaults are 10 s, TTL/3
// and 2/3 TTL, as client-go's leader election. A shorter TTL speeds up the
// takeover after a crash (about TTL after the last renewal) but leaves less
// room for pauses; an Unlock hands over at once whatever the TTL. A TTL of
// decades is accepted; the arithmetic saturates rather than overflow.
//
// Config.OnRenewal runs on a goroutine of its own, never on the renewer:
// it may call any method of the Lock, Unlock and Close included.
package lock
