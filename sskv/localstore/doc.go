// Package localstore is a local Azure IoT Operations state store: a real MQTT
// v5 broker (upstream mochi-mqtt) with the state store protocol built in, for
// tests, examples and development on a laptop. It answers as the deployed
// service does (docs/protocol.md), so that code tested against it works
// against a cluster, and the official SDK clients work against it unchanged.
//
// A Server for a test starts on a free loopback port, in the spirit of
// net/http/httptest:
//
//	srv, err := localstore.Start(localstore.Config{})
//	if err != nil { ... }
//	defer srv.Close()
//	addr := srv.Addr() // "127.0.0.1:NNNNN"
//
// Authentication (passwords, Kubernetes SAT tokens, client certificates), a
// TLS listener, per-user key prefixes, limits and persistence are set in
// [Config]; cmd/statestore runs the same store as a process.
//
// # What it implements
//
//   - SET (NX, NEX, PX), GET, DEL, VDEL, KEYNOTIFY and KEYNOTIFY STOP at QoS
//     1, with versions from the store's hybrid logical clock, fencing tokens
//     (__ft) and the service's response properties and error texts, byte for
//     byte. A __ts or __ft more than Config.MaxDrift (60 s) ahead is refused.
//   - PX expiry to the scheduler's precision, also enforced on every read;
//     expiry, DEL and VDEL notify watchers with DELETE.
//   - Notifications go into the watching client's own session exactly once,
//     in version order; watches end with the connection.
//   - A SET, DEL or VDEL sent again in a resumed session (same correlation
//     data, payload and __ts) is answered as the first was, not executed
//     twice: for its Message Expiry (at least one minute, at most five) and
//     until the client reuses its packet id. GET and KEYNOTIFY run again.
//   - A request is executed only within its Message Expiry Interval, counted
//     from the broker's receipt (time a Hold keeps it back excluded); later,
//     it is dropped unanswered and logged.
//   - Requests the protocol forbids are never executed: no response topic
//     (dropped, logged), an invalid one (PUBACK 0x90), QoS 0 or no
//     correlation data (-ERR [MsgNotQoS1], [MsgNoCorrelation]), a forbidden
//     one such as the invoke topic (the client is disconnected).
//   - Everything else is an ordinary MQTT broker, except under clients/,
//     where topics are isolated per client and user (see Tenants).
//
// Five -ERR texts are this package's, for cases the service documents none
// for: [MsgNotQoS1], [MsgNoCorrelation], [MsgClockAhead],
// [MsgResponseTooLarge] and [MsgPersistFailed].
//
// # Slow clients and other limits
//
// The store never does network I/O, or waits on a client, while it holds
// its state lock, so no client can stop it, and what it holds for a client
// is bounded:
//
//   - A connection with more than Config.MaxPendingMessages (8192) messages
//     unacknowledged or queued, or whose writes take longer than
//     Config.WriteTimeout (5 s), is disconnected (DISCONNECT 0x97), never
//     left connected with messages silently dropped; a request sent at the
//     limit is not executed (PUBACK 0x97).
//   - A packet larger than Config.MaxPacketSize (4 MiB) ends its connection
//     before anything is allocated for it. Nothing the store sends is larger
//     than the client's Maximum Packet Size: a response that would be is
//     replaced by [MsgResponseTooLarge]; a notification that would be
//     disconnects the client (0x95).
//   - A malformed packet ends its connection, and only that one.
//   - Keys and bytes per user, watches and subscriptions per connection, and
//     retained messages per user are bounded by Config's limits (none in the
//     zero Config; the standalone store sets them).
//   - The broker's log never carries payloads.
//
// # Tenants
//
// Users are isolated from each other, as authorization policies isolate
// them on a deployed broker: one user can neither read another's values nor
// make another's locks or elections misbehave. A client's user is the name
// the store verified (password, SAT token or certificate CommonName), never
// the one CONNECT merely carries; without authentication, everyone is the
// one anonymous user. Keys are isolated by Config.KeyPrefixes; topics under
// clients/ by client id and user. Not isolated: topics outside clients/,
// resources beyond the limits set, the store's clock, and a client id while
// it is not connected. docs/localstore.md gives the rules in full.
//
// # Faults and restarts
//
// [Server.Kick], [Server.Drop], [Server.Hold], [Server.SetResponseFault] and
// [Server.SetClockOffset] inject faults into one client's connection;
// package faultproxy cuts a client off across reconnects. [Server.Restart]
// stops the store as a crash would and starts it again on the same address.
// By default keys are in memory only; with Config.Persist and Config.DataDir
// they survive a restart, even a kill, with their value, version, token and
// expiry, and versions go on above every one issued before. MQTT sessions do
// not survive a restart.
//
// # Not supported
//
// Clustering, and MQTT features beyond mochi-mqtt's. It does not hold
// messages back at a client's Receive Maximum: up to MaxPendingMessages are
// in flight to a client (clients with the usual 65535 never notice).
//
// # Costs
//
// Measured with the commands in docs/benchmarks.md:
//
//	an idle connection, in process           2 goroutines, about 27 KB
//	an idle sskv client, standalone store    about 42-45 KB of RSS
//	1M keys of 16 B with 32-B values         about 314 MB of RSS, standalone store
//
// docs/design/mochi-upstream.md says what a smaller connection would need
// from mochi-mqtt.
package localstore
