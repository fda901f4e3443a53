// Package localstore is a local Azure IoT Operations state store: a real MQTT
// v5 broker (mochi-mqtt) with the state store protocol built in, for tests,
// examples and development on a laptop.
//
// It answers as the deployed service does (docs/protocol.md in the
// repository describes it, and where Microsoft's public document differs), so
// that code tested against it works against a cluster and the
// official SDK clients work against it unchanged:
//
//   - SET (NX, NEX, PX), GET, DEL, VDEL, KEYNOTIFY and KEYNOTIFY STOP, published
//     at QoS 1 to the invoke topic with a response topic and correlation data.
//   - Versions from the store's hybrid logical clock, updated with each
//     request's __ts; every response carries __stat=200, __protVer=1.0 and the
//     echoed correlation data, and __ts = the key's version where there is one.
//   - Fencing tokens (__ft) on SET, DEL and VDEL; __ts and __ft more than
//     Config.MaxDrift (60 s) ahead of the store's clock are refused; every
//     error message is the service's, byte for byte.
//   - PX expiry, accurate to the scheduler's precision (a timer on a heap of
//     deadlines, never a scan), also enforced on every read of the key; expiry,
//     DEL and VDEL notify watchers with DELETE.
//   - Notifications go into the watching client's own session exactly once,
//     whether or not it subscribed to its notification topic, with __ts.
//     Watches end when the client's connection ends. A KEYNOTIFY of a key
//     whose notification topic would be longer than MQTT allows (65,535
//     bytes: the topic carries the client id and the key in hex) is refused
//     with the quota error.
//   - A SET, DEL or VDEL that a client sends again (its resumed session
//     resends what it saw no PUBACK for: the same correlation data, payload
//     and __ts) is answered as the first one was, and not executed twice,
//     as the Azure IoT Operations request/response protocol asks of
//     executors: for the request's Message Expiry Interval, but at least a
//     minute and at most five, and until the client reuses the request's
//     packet id (it has the PUBACK then). A copy that comes later than that
//     is executed again. GET and KEYNOTIFY are executed again: a watch
//     belongs to a connection.
//
// Requests the protocol forbids, or whose response could not be delivered,
// are never executed: one without a response topic is dropped (and logged);
// one whose response topic is not a topic name one can publish to (it has a
// wildcard + or #, or starts with $SYS) gets a PUBACK with reason 0x90, topic
// name invalid; one at QoS 0 or without correlation data is answered with an
// -ERR; a client naming a forbidden response topic (the invoke topic, or one
// under clients/statestore/v1/<service id>) is disconnected. Everything else
// is an ordinary MQTT broker: clients publish and subscribe to each other as
// usual, except under clients/, where only the store publishes notification
// topics, a client reads only its own, and users keep to their own client
// namespaces (see Tenants).
//
// A request is executed only within its Message Expiry Interval, as MQTT
// lets a broker deliver a message only until it expires [MQTT-3.3.2-5]: one
// still waiting for the store when its expiry has passed (requests wait for
// the store's lock, behind other clients' requests), counted from the moment
// the broker read it, is dropped unanswered and logged with its age and
// expiry. Its PUBACK is a success, as for any message that expired before
// delivery. Its sender has normally given up on it by then: sskv sends the
// time left before the request's deadline as its expiry, the official SDKs
// their request timeout. Time that Hold keeps a request from the broker
// does not count, as it does not for a packet delayed on the network.
//
// # The store's own error messages
//
// Every -ERR text is the service's (see docs/protocol.md), except these five,
// for cases the service documents no text for; they are this package's
// (MsgNotQoS1, MsgNoCorrelation, MsgClockAhead, MsgResponseTooLarge,
// MsgPersistFailed):
//
//   - "requests must be published with QoS 1": a request at QoS 0.
//   - "requests must carry correlation data": a request without it.
//   - "the state store's clock is more than the maximum drift ahead of its
//     system clock, which has stepped back; retry once the system clock has
//     caught up": the store's wall clock stepped back by more than MaxDrift
//     after the store issued versions (a request stamped ahead of the store
//     is refused with the service's "the request timestamp is too far in the
//     future").
//   - "the response is larger than the client's maximum packet size": the
//     response would not fit the Maximum Packet Size the client announced
//     (see below).
//   - "the state store could not write the key to its data directory": a
//     persisted write could not be made durable (a full disk); it was
//     undone (see Persistence and restarts).
//
// # Slow clients and other limits
//
// The store never does network I/O, or waits on a client, while it holds its
// state lock, so no client can stop it. What it sends a client is bounded:
//
//   - Notifications wait, in version order, in a queue per connection, which
//     a goroutine per connection hands to the broker; it runs only while
//     the queue holds notifications.
//   - An idle connection costs the broker's two goroutines (mochi's reader
//     and writer) and about 27 KB (BenchmarkIdleConnectionCost); an idle
//     sskv client costs the standalone store about 55-66 KB of RSS
//     (BenchmarkIdleClientRSS in cmd/statestore). The broker is upstream
//     mochi-mqtt, unchanged; docs/design/mochi-upstream.md says what a
//     smaller connection would need from it.
//   - At most Config.MaxPendingMessages (default 8192) messages are held for
//     a connection: QoS 1 messages sent and not yet acknowledged, plus queued
//     notifications. A client that reaches the limit is disconnected with
//     DISCONNECT 0x97 (quota exceeded), logged at Warn with the counts, as
//     Redis disconnects a slow pub/sub subscriber; a request it sends while
//     at the limit is not executed (its PUBACK says 0x97). It is never left
//     connected with messages silently dropped: a client that reconnects and
//     re-registers its watches (as sskv does) is up to date again. Messages
//     not yet written when the DISCONNECT goes out stay in the client's
//     session, as on any lost connection: a client that resumes its session
//     gets them, one that starts clean does not. The
//     broker's own queue of pending writes to a connection is short (128
//     packets): whoever sends a client a message waits for room in it, for
//     at most Config.WriteTimeout, after which the client is disconnected
//     the same way; should the broker drop a message anyway, the client is
//     disconnected too.
//   - Every write to a client's socket must complete within
//     Config.WriteTimeout (default 5 s); a client that does not read for
//     that long is disconnected, its connection closed.
//   - A packet larger than Config.MaxPacketSize (default 4 MiB, announced in
//     CONNACK) ends the connection; its declared length is checked before
//     anything is allocated for it, CONNECT included.
//   - Nothing from the store is larger than the Maximum Packet Size a client
//     announced in CONNECT, which MQTT would have the broker drop without a
//     word. A response that would be is replaced by an -ERR with
//     MsgResponseTooLarge, so the request fails at once. A notification
//     that would be disconnects the client with DISCONNECT 0x95 (packet too
//     large), as a slow client is disconnected rather than left with a
//     notification lost: a client that reconnects and reads its watched keys
//     again (as sskv does) gets that error then. Both are logged at Warn
//     with the sizes. Sizes are counted to the byte as the broker encodes
//     the packet (2 bytes over for a client that subscribed at QoS 0); so
//     that they do not depend on earlier messages, the broker sends no
//     client a topic alias.
//   - A malformed packet ends its connection, and only that: mochi v2.7.9's
//     decoder panics on some (a truncated MQTT 5 SUBSCRIBE,
//     mochi-mqtt/server#501), which would end the process, so the store
//     recovers from panics raised in the decoder and from nowhere else.
//   - A client with more than 1024 (the broker's Receive Maximum) QoS 2
//     messages unacknowledged to the store is disconnected with 0x93. QoS 1
//     requests are acknowledged as they are executed, in order, so they
//     never count against it.
//   - What a user, or a connection, makes the store keep is bounded by
//     the limits of Config described in Tenants below: keys and their bytes
//     per user, watches and subscriptions per connection, retained messages
//     per user. None is set in the zero Config.
//
// The broker's log never carries payloads: packets in its records are
// replaced by their type and sizes.
//
// Limits, authentication (username/password, Kubernetes SAT tokens, client
// certificates), a TLS listener and a per-user key-prefix ACL are set in
// Config.
//
// A Server for a test starts on a free loopback port, in the spirit of
// net/http/httptest:
//
//	srv, err := localstore.Start(localstore.Config{})
//	if err != nil { ... }
//	defer srv.Close()
//	addr := srv.Addr() // "127.0.0.1:NNNNN"
//
// # Tenants
//
// Users are isolated from each other, as authorization policies isolate
// them on a deployed broker: one user can neither see another's values nor
// make another's locks or elections misbehave. A client's user is the name
// the store verified, never the one CONNECT merely carries:
//
//   - with Config.Users, the user whose password the client gave;
//   - with Config.SATTokens, the user its token maps to;
//   - with neither, the Subject CommonName of a client certificate that the
//     TLS listener verified (Config.TLS with ClientAuth
//     VerifyClientCertIfGiven or RequireAndVerifyClientCert; a verified
//     certificate without a CommonName is refused);
//   - otherwise "", the anonymous user, whatever CONNECT says.
//
// Start refuses KeyPrefixes that name users when none of these can verify
// one. Anonymous clients are one user, so a store without authentication is
// a single tenant.
//
// Keys are isolated by KeyPrefixes. Topics under clients/ are isolated by
// these rules, which apply with or without authentication:
//
//   - clients/statestore/... is the store's: nobody else publishes there,
//     and a client reads only its own notification topics,
//     clients/statestore/v1/<service id>/<HEX(client id)>/...
//   - clients/<client id>/... and clients/<HEX(client id)>/... (upper-case
//     hex) are the client id's namespace: response topics go there (sskv's,
//     the .NET and Rust SDKs' use the id, which counts only when it is one
//     topic level other than "statestore"; the Go SDK's use the hex). A
//     namespace belongs to the user of the id's connections. A client
//     publishes, and subscribes, only in namespaces of its own user: a
//     PUBLISH elsewhere under clients/ is refused (PUBACK 0x87, not
//     authorized), and so is a request whose response topic is (it is not
//     executed; one naming the store's topics disconnects the client, as
//     above).
//   - A retained message under clients/ is refused (PUBACK 0x87), and so is
//     a CONNECT whose Will is under clients/, unless it is on the client's
//     own namespace and neither retained nor delayed (CONNACK 0x87).
//   - A subscription that can match only topics the client may not read is
//     refused (SUBACK 0x87). One that can match others too (#, +/...,
//     clients/#, clients/+/...) is granted and narrowed: the broker checks
//     every message, retained ones included, against its recipient, and
//     the client never gets the others.
//   - A shared subscription is granted only if the client may read
//     everything it can match: the broker picks one member of a group per
//     message before it checks what that member may read, so a member that
//     may not would swallow it. The group through which the store delivers
//     notifications, $share/dsslock-localstore-watch, is refused to all.
//
// A client id belongs to the user of its connection while it is connected:
// another user's CONNECT with it is refused (CONNACK 0x87), and the
// connected client does not notice. Once the id is not connected, any user
// may connect with it (so that a client whose rotated credentials map to
// another user keeps its client id and session): its namespaces become
// that user's, and the session the broker kept passes on without the
// messages waiting in it and without the subscriptions the new user may
// not make. Client ids whose namespaces overlap (the id "41" is the hex of
// the id "A") count as one.
//
// Without authentication, these rules change nothing clients of one user do
// with each other: a client answers another's request on its response
// topic (the SDKs' RPC) or follows its responses as on any broker. Only
// retained messages under clients/, Wills there off the client's own
// namespace, the namespaces of client ids that never connected, other
// clients' notifications and the store's own topics are refused, and
// nothing in dsslock or the official SDKs relies on those.
//
// Not isolated between users:
//
//   - Topics outside clients/: they are an ordinary broker's, shared by
//     all, retained messages and shared subscriptions included.
//   - Resources, unless limited in Config: MaxKeysPerUser and
//     MaxBytesPerUser bound the keys each user creates (beyond them its SET
//     gets "the quota has been exceeded", and only its own), and
//     MaxRetainedPerUser and MaxRetainedBytesPerUser its retained messages
//     (PUBACK 0x97); MaxWatchesPerClient and MaxSubscriptionsPerClient
//     bound those of each connection (-ERR "the quota has been exceeded",
//     SUBACK 0x97). An embedded store's zero Config sets none of them;
//     the standalone store (cmd/statestore) sets them by default (those on
//     keys only when it authenticates clients).
//     The number of connections, and of sessions the broker keeps for
//     clients gone, is not limited per user, nor is the global MaxKeys
//     (keep it 0, or at least MaxKeysPerUser times the number of users).
//   - The store's hybrid logical clock, which any request's __ts within
//     MaxDrift ahead moves forward for everyone, as on the service.
//   - A client id while it is not connected: another user can take it and
//     keep its owner out for as long as it stays connected (though it gets
//     nothing of the owner's).
//   - Within one user, clients share their namespaces: each reads and
//     publishes in the others' (not their notifications), as they share
//     their keys.
//
// # Fault injection
//
// A Server injects faults, to test what a client does when they happen:
//
//   - Kick disconnects a client the way an administrator would (DISCONNECT
//     0x98); Drop cuts its connection without a word, as a network failure.
//   - Hold freezes one direction, or both, of a client's current connection
//     until Release, as a network path that stops passing packets: what it
//     holds back goes through on Release, but a hold longer than the
//     client's keep-alive x 1.5 (reads) or Config.WriteTimeout (writes)
//     ends the connection, as it would on a real network.
//   - SetResponseFault delays a client's responses (in order), or executes
//     its requests and never answers them, so that the client cannot know
//     whether they were applied.
//   - SetClockOffset skews the store's clock.
//
// Hold ends with the connection it holds. To cut a client off across its
// reconnects, or to fault the traffic between a client and any broker, use
// the TCP proxy of package github.com/dsslock/dsslock/faultproxy.
//
// # Persistence and restarts
//
// By default every key is in memory only, gone with Close. With
// Config.Persist and Config.DataDir the store keeps keys on disk, as the
// service's broker does when its persistence is on: those whose SET carried
// aio-persistence: true (PersistDynamic), or all of them (PersistAll). A
// persisted key comes back after a restart, even after the process was
// killed, with its value, version, fencing token and expiry (a wall-clock
// deadline); versions go on above every one issued before; a persisted
// write is answered, and acknowledged, once it is durable, in group
// commits. docs/protocol.md, "Persistence", has the rules and what they
// cost.
//
// Restart stops an embedded store as a crash would and starts it again on
// the same address: the way to test what a service does across a restart
// of the broker.
//
// What it does not do: clustering, or MQTT features beyond what mochi-mqtt
// provides; MQTT sessions are not kept across a restart. It
// does not hold messages back when a client's Receive Maximum is reached
// (mochi's flow control can deadlock when a client stops reading): up to
// Config.MaxPendingMessages QoS 1 messages are in flight to a client, and
// clients with the usual Receive Maximum of 65535 never notice.
package localstore
