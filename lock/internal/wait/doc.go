// Package wait is the middle of package lock's three floors: the wait
// policies of a Lock, over the lease core (package lease), which is all it
// imports of lock.
//
//   - Racing waiters (Config.Race): a waiter watches the key and, when it is
//     deleted or expires, races for it with one SET NEX; a safeguard
//     recheck every 10 TTLs covers a lost notification.
//   - The queue (the default): a waiter joins the holder's inbox and is
//     handed the lock in the order it came. qcore (queuestep.go) is its
//     pure state machine, docs/design/queue.md its normative spec, and
//     TestQueueSimulation its deterministic simulation, seed by seed.
//
// Both wait on notifications, never take a key within a TTL of a reconnect
// (the hold-off: lease.HoldOff), and start a holding only through the
// Lease's acquisition.
package wait
