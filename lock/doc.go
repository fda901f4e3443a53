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
// A Lock that waits ([Lock.Lock]) watches the key (KEYNOTIFY) and sleeps
// until it is deleted, by a release or by expiry, then tries at once. It
// sends no request while the holder keeps renewing; a free lock costs one
// request. A waiter that lost a race for the key waits a short random time
// before its next try. After a reconnect the watch reports that it may have
// missed changes and the waiter checks at once; as a last safeguard it also
// checks after 10 TTLs without news. A timeout or a lost connection is
// retried; a request the store refuses (a *sskv.ServiceError: a clock more
// than a minute ahead of the store's, sskv.ErrTimestampSkew, or no
// authorisation) ends the wait at once with that error, since it would be
// refused again.
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
// watches its key, and its holding ends as lost (ErrHeldByOther) the moment
// the key is deleted behind its back (by hand, or lost by a store restart)
// or taken by another holder: its renewals, SET NEX, would otherwise create
// the key again, after another holder may have held it in between. Without
// FenceKey that is what happens. Package leader builds on this.
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
//
// What it does not guarantee: a lease is only as good as the holder's
// reaction to Done. Work that ignores its context can still run after the
// lock passed to another holder; fencing (package fenced) then keeps its
// writes out of the keys it protects, but not its effects elsewhere. The
// clocks of holder and store must run at about the same rate (any NTP-kept
// clock does): TTL - RenewDeadline must exceed their difference over a TTL.
//
// # Configuration
//
// TTL, RenewInterval and RenewDeadline must satisfy 0 < RenewInterval <
// RenewDeadline < TTL, in whole milliseconds; the defaults are 10 s, TTL/3
// and 2/3 TTL, as client-go's leader election. A shorter TTL speeds up the
// takeover after a crash (about TTL after the last renewal) but leaves less
// room for pauses; an Unlock hands over at once whatever the TTL.
package lock
