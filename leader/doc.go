// Package leader elects one leader among candidates on the Azure IoT
// Operations state store: for active/standby services in which exactly one
// replica must do the work, and another must take over within moments when
// it stops.
//
//	t, err := leader.Campaign(ctx, client, "orders/leader", []byte("10.0.0.5:8080"))
//	if err != nil {
//		return err // ctx ended; nothing left behind
//	}
//	err = work(t.Context(), fenced.New(client, t)) // cancelled the moment leadership is lost
//	_ = t.Resign(context.Background())             // after work has returned: hands over at once
//
// or, to campaign again after each loss, with callbacks and a health check:
//
//	e, err := leader.NewElector(client, "orders/leader", []byte("10.0.0.5:8080"),
//		leader.WithTTL(5*time.Second))
//	if err != nil {
//		return err
//	}
//	http.Handle("/healthz", e)
//	err = e.Run(ctx, func(ctx context.Context, t *leader.Term) error {
//		return work(ctx, fenced.New(client, t))
//	})
//
// An election is one key, held as a [lock.Lock] with Config.FenceKey: the
// leader's [Term] carries the key's fencing token, and the key records the
// leader's id, token and value ([Term.Proclaim] changes the value).
// Candidates that do not lead sleep on notifications of the key; [Observe]
// follows it. A [Group] spreads many elections (shards) over a few replicas,
// over those of the highest priority ([WithPriority]) when members have
// priorities.
//
// # Guarantees
//
//   - Never "leader" without leading: Campaign returns a term only after the
//     store applied both of its writes, within RenewDeadline of the first. A
//     campaign that gives up deletes what it may have written.
//   - Lost is decided by the leader on its own monotonic clock, before the
//     store can expire the key: with no renewal within RenewDeadline, the
//     term's Context is cancelled and Err wraps [ErrLost] and
//     lock.ErrRenewDeadline; the work has TTL - RenewDeadline to stop. A
//     newer term found by a renewal or a fenced write (only this term's), or
//     the key deleted behind its back (lock.ErrKeyLost), ends it at once;
//     but a deletion that crosses a renewal held up in the network is
//     undone by that renewal, and the term goes on (see package lock).
//   - A term never outlives its key: after a reconnect, or when its watch
//     lost track of the key, the leader reads its key before it writes
//     again, and the term ends if the key is gone, at another version, or
//     another's. Requests of a term are never sent again on a later
//     connection.
//   - A candidate never takes a key someone may still believe they hold: one
//     that had seen a leader waits a TTL after a reconnect before it
//     campaigns for a missing key.
//   - The key is given up only after the work has returned: a lost term
//     never deletes it, and [Elector.Run] resigns only once the work has
//     returned. A resign does not wait for a store that is away (the error
//     wraps lock.ErrNotReleased); Elector.Run bounds its wait by the TTL.
//   - A transfer ([Term.Transfer], [Elector.Transfer], or to a candidate of
//     a higher priority: [WithPriority]) happens only once the work has
//     returned, with one write fenced with the term's token that reserves
//     the key for the named candidate: it takes the key at once, and nobody
//     else in between; if it has gone, the reservation expires after the
//     TTL and an ordinary election follows.
//   - Term tokens increase strictly from one term to the next, and the store
//     refuses writes fenced with a term's token (package fenced), and that
//     term's Proclaim or renewal, once a later term has written the key.
//   - Observers see every change (the state at the start, each new term,
//     each Proclaim, and "no leader"); one they may have missed comes as a
//     State with Resync set, never as silence.
//   - A key that will never be released to a candidate (a semaphore's
//     record, a value no lock writes, the SDK's leased lock) ends Campaign
//     at once with an error wrapping lock.ErrNotALock.
//   - A Group has at most one leader per election, each term fenced; members
//     that disagree on who should lead cost balance, never safety. Balance
//     is eventual: a change settles after a twentieth of the TTL (10 to
//     100 ms), and an election moved has no leader for milliseconds.
//
// # What it assumes, and does not guarantee
//
//   - The clocks of candidates and store run at about the same rate (their
//     offset does not matter up to the store's 60 s skew limit): TTL -
//     RenewDeadline must exceed their difference over a TTL.
//   - Work that ignores its context can run on after another leader was
//     elected; fencing keeps its writes out of the keys it protects, not its
//     effects elsewhere. A request delayed in the network by more than TTL -
//     RenewDeadline can land after its term ended: fencing makes it harmless
//     to keys written by later terms, and an election key it re-creates
//     expires after one TTL.
//   - A request whose answer is lost on a connection that stays up holds its
//     caller until its deadline or the client's RequestTimeout: give the
//     work's requests deadlines shorter than it may stall without harm.
//   - Unless the store persists every key (localstore's PersistAll, the
//     service's persistence mode All), a store restart loses the election
//     key and ends the term (once the leader reconnects and reads its key),
//     and a new leader is elected about a TTL after the candidates
//     reconnect; with it, the leader confirms its key at the same version
//     and its term goes on. A candidate whose
//     first connection comes just after a restart campaigns at once; until
//     the former leader has reconnected both may lead, but the former
//     leader's fenced writes wait for its read, and so never go out.
//     Persist the keys written with a term's token that must survive.
//   - A Group does not support two members with one id, more members than
//     MaxMembers (the extra ones lead nothing), or members that disagree on
//     the elections, TTL or MaxMembers (balance suffers, safety does not).
//     A member of a version without Group priorities counts a member with
//     a priority as another member (balance suffers, safety does not).
//     On an overloaded machine a short TTL can make terms lost, and
//     elections move, until the load drops.
//
// # Costs
//
// Measured on the local store; docs/benchmarks.md has the commands.
//
//	a follower, while the leader renews   no requests, no goroutine of the library
//	1,000 elections, 3 candidates each    about 3.9 KB of client heap per election
//	takeover after a leader crashed       about TTL after its last renewal
//	takeover after a Resign               at once
//	Group: a dead member's elections      led again within a TTL and a little
//	Group: a member that joins            leads its share within about a second
//	Group: a member of higher priority    leads every election within the settling
//	that joins                            time (TTL/20, 10-100 ms) and ~20 ms
//
// Settings follow [lock.Config]: 0 < RenewInterval < RenewDeadline < TTL,
// defaults 10 s, TTL/3 and 2/3 TTL ([Option]). docs/design/leader.md
// describes how campaigns, observers and groups work.
package leader
