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
// # How it works
//
// An election is one key of the state store, held as a [lock.Lock] with
// Config.FenceKey. A candidate takes it with SET NEX PX; the version the
// store returns is its term's fencing token, which it then writes into the
// key with a SET fenced with that token. Only then does Campaign return:
// the key now reads "candidate id, token, value", and the store refuses any
// write of it that carries an older token. The leader renews the key every
// RenewInterval; [Term.Proclaim] rewrites its value (fenced, so it can
// never overwrite a newer term's record); [Term.Resign] deletes it.
//
// Candidates that do not lead watch the key (KEYNOTIFY) and sleep: they send
// no request while the leader renews, and have no goroutine of the library
// (only Campaign's own, asleep). BenchmarkManyElections (package interop:
// 1,000 elections, each with a leader and two waiting candidates on three
// clients) measures about 3.75 KB of client heap per election, beside the
// three clients and the callers' goroutines: a follower keeps no Lock while
// it waits ([lock.Acquire]), and sleeps on one channel and its caller's
// context, woken by a callback watch and by its client's one timer for the
// safeguard checks of all its waiters. When the key is deleted, by a
// resignation or by expiry, each of them tries at once, and one wins. After
// a reconnect, a candidate checks at once; as a last safeguard, it checks
// after 10 TTLs without news. A key that will never be released to a
// candidate ends Campaign at once with an error wrapping lock.ErrNotALock
// that says what the key holds: a semaphore's record, a value no lock
// writes, or a holder's name alone, such as the record of the Azure IoT
// Operations SDK's leased lock, whose replicas cannot share an election's
// key. Observers ([Observe]) watch the same key and
// read its records; a client's campaign and observation of one election
// share one registration with the store.
//
// # Guarantees
//
//   - Never "leader" without leading. Campaign returns a term only after the
//     store applied both of its writes, within RenewDeadline of sending the
//     first. A campaign that gives up, or whose last attempt had an unknown
//     outcome, deletes what it may have written: no zombie candidate and no
//     phantom leadership after a connection drops mid-campaign.
//   - Lost is decided by the leader on its own monotonic clock, before the
//     store can expire the key. If no renewal succeeds within RenewDeadline
//     of sending the last successful one, the term ends: its Context is
//     cancelled and Err wraps ErrLost and lock.ErrRenewDeadline. The store
//     keeps the key for TTL - RenewDeadline more: the time the leader's work
//     has to stop before another candidate can be elected. A renewal that
//     finds a newer term ends it at once, and so does a fenced write that
//     finds a newer token (only that term's: a late refusal of an earlier
//     term's write never ends a later one). The leader also watches its key:
//     if the key is deleted behind its back, the term ends at once
//     (lock.ErrKeyLost) rather than re-creating it with the next renewal.
//   - A term never outlives its key. After a reconnect, or when its watch
//     lost track of the key, the leader reads its key before it writes
//     anything more, and the term ends if the key is gone (a store restart
//     loses every key), at another version, or another candidate's.
//     Requests of a term are never sent again on a later connection, and a
//     request whose caller gave up is never sent again at all (see package
//     sskv), so no renewal of an ended term re-creates the key.
//   - A candidate never takes a key someone may still believe they hold:
//     after a store restart, a candidate that had seen a leader waits a full
//     TTL since its reconnect before it campaigns for the missing key, by
//     which time the former leader has given its term up on its own clock.
//   - The key is given up only after the work has returned: a lost term
//     never deletes the key by itself, and [Elector.Run] resigns only once
//     the work of the term has returned. A resign does not wait for a store
//     that is away: with the client's connection lost it returns at once
//     (the error wraps lock.ErrNotReleased), and Elector.Run bounds its
//     wait by the TTL. [Elector.Check] is healthy while Run resigns: the
//     work has returned, so nothing acts as leader.
//   - Term tokens increase strictly from one term to the next. Writes
//     fenced with a term's token (package fenced) are refused by the store
//     once a later term has written the same keys, whatever the old leader
//     believes; the old leader's Proclaim or renewal is refused the same way.
//   - Observers see every change: the state at the start, each new term,
//     each Proclaim, and "no leader". A change they may have missed (during
//     a reconnect, or when they fell behind) comes as a State with Resync
//     set, never as silence. A renewal is not a change.
//
// What it assumes and does not guarantee: the clocks of candidates and store
// run at about the same rate (any NTP-kept clock does; their offset does not
// matter up to the store's 60 s skew limit): TTL - RenewDeadline must exceed
// their difference over a TTL. Work that ignores its context can still run
// after another leader was elected; fencing keeps its writes out of the
// keys it protects in the store, but not its effects elsewhere (files,
// other services). A leader's request delayed in the network by more than
// TTL - RenewDeadline can land after its term ended; fencing makes it
// harmless to keys written by later terms, and an election key it re-creates
// expires after one TTL. A request whose answer is lost (applied by the
// store, but never answered, on a connection that stays up) holds its caller
// until the caller's deadline or the client's RequestTimeout. A campaign
// gives up on a lost answer within a TTL and tries again, but the work's own
// requests need deadlines of their own, shorter than the time it may stall
// without harm.
//
// # Groups: many elections
//
// A service that splits its work into shards (one election per shard,
// asset or partition) and runs a few replicas wants the leaderships spread
// over the replicas, not piled on whichever started first. A [Group] does
// that:
//
//	g, err := leader.NewGroup(client, "orders/replicas", shards, []byte("10.0.0.5:8080"))
//	if err != nil {
//		return err
//	}
//	err = g.Run(ctx, func(ctx context.Context, t *leader.Term) error {
//		return serve(ctx, t.Election(), fenced.New(client, t)) // one shard, until ctx ends
//	})
//
// Each member holds one of MaxMembers slot keys (the group's name,
// "\x00member\x00" and a number), a [lock.Lock] with the group's TTL whose
// value is the member's id, and watches every slot key (KEYNOTIFY) to know
// the live members: the store has no list or scan, and nothing polls. Every
// member computes the same [Assignment] of the elections to the live
// members (rendezvous hashing with bounded load: each member gets E/M
// elections, rounded down or up, and a join or a leave moves about E/M of
// them) and campaigns only in those assigned to it. An election no longer
// assigned to a member is handed over: the work of its term is cancelled
// and, once it has returned, the term is resigned, and the new owner's
// campaign, waiting on the key, takes it at once. A member that stops (its
// Run's context ends) gives up its slot, then its terms: the others take
// over at once. A member that dies stops renewing: its slot and its terms
// expire within the TTL, and the others, seeing the slot go, take its
// elections as their keys expire. [Leaders] reads who leads each election,
// for observers.
//
// What a group guarantees, and what it does not:
//
//   - At most one leader per election at every moment, and each term fenced,
//     as for any election of this package: a member leads an election only
//     with a term, and hands it over only by resigning after the work has
//     returned. Members that disagree on who should lead (their views of
//     the members differ for a moment, or they were given different
//     elections) cost balance, never safety.
//   - Balance is eventual. It holds once every member has seen the same
//     members: a few milliseconds after a change in a healthy group, plus
//     a settling time (a twentieth of the TTL, between 10 and 100 ms) in
//     which a member waits for more changes before it moves anything. While
//     an election is handed over, it has no leader from the old owner's
//     resign to the new owner's campaign: milliseconds.
//   - Time bounds: a dead member's elections are led again about a TTL
//     after its last renewal, so within a TTL and a little of its death
//     (2.0 to 2.8 s with a TTL of 2 s in TestGroup, under the race
//     detector); a member that joins leads its share within a second or so
//     (BenchmarkGroup: 0.3 to 1.1 s for a fourth member to lead 250 of 1,000
//     elections); a leaving one hands its elections over at once. A
//     member's renewals share its connection with everything else it sends:
//     on an overloaded machine, a short TTL can make terms lost, and
//     elections move, until the load drops. After a reconnect or a store restart, the hold-offs of the
//     package apply: no slot or election is taken within a TTL of a
//     reconnect.
//   - Not guaranteed: members with the same id (the id is also the
//     candidate id of the member's terms: two of them would count as one),
//     more members than MaxMembers (the extra ones wait for a free slot and
//     lead nothing), or members with different elections, TTLs or
//     MaxMembers in one group (balance suffers; safety does not). A work
//     that returns while its term lasts ends the member's Run, as it ends
//     [Elector.Run].
//
// # Store restarts
//
// A broker restart or upgrade loses the election's key (it is not
// persisted). The leader's term ends as soon as it has reconnected and read
// its key (by its renew deadline if it cannot reconnect), and a new leader
// is elected about a TTL after the candidates reconnect: no two leaders in
// between. With a persisted key the term would go on and a restart would
// cost nothing; the library does not persist it, so that an election never
// depends on the store's disk. Persist the keys the leader writes with its
// term's token if they must survive a restart: a key's fencing token goes
// with the key. A candidate process whose first connection succeeds at once
// just after a restart has seen nothing and campaigns at once (one started
// while the store was down holds off): until the former leader has
// reconnected, both may lead, though the former leader's fenced writes wait
// for its key to be confirmed, and so never go out.
//
// # Configuration
//
// TTL, renew interval and renew deadline follow [lock.Config]: 0 <
// RenewInterval < RenewDeadline < TTL, in whole milliseconds; the defaults
// are 10 s, TTL/3 and 2/3 TTL, as client-go's. A crashed leader is replaced
// about TTL after its last renewal; a resigning one at once. Options are
// functional ([Option]); those that do not apply to a call are ignored.
// Metrics.Renewal runs on a goroutine of its own, never on the renew loop,
// so it may call Resign.
package leader
