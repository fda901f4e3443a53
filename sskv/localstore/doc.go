// Package localstore is a local Azure IoT Operations state store: a real MQTT
// v5 broker (mochi-mqtt) with the state store protocol built in, for tests,
// examples and development on a laptop.
//
// It answers as the deployed service does (see wire-notes.md in the project's
// spec), so that code tested against it works against a cluster and the
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
//     Watches end when the client's connection ends.
//
// Requests the protocol forbids are never executed: one without a response
// topic is dropped (and logged); one at QoS 0 or without correlation data is
// answered with an -ERR; a client naming a forbidden response topic (the
// invoke topic, or one under clients/statestore/v1/<service id>) is
// disconnected. Everything else is an ordinary MQTT broker: clients publish and
// subscribe to each other as usual. Only the store publishes notification
// topics, and a client may read only its own.
//
// Limits, authentication (username/password, Kubernetes SAT tokens), a TLS
// listener and a per-user key-prefix ACL are set in Config.
//
// A Server for a test starts on a free loopback port, in the spirit of
// net/http/httptest:
//
//	srv, err := localstore.Start(localstore.Config{})
//	if err != nil { ... }
//	defer srv.Close()
//	addr := srv.Addr() // "127.0.0.1:NNNNN"
//
// Kick and Drop disconnect a client, and SetClockOffset skews the store's
// clock, to test what a client does when those happen.
//
// What it does not do: keep data beyond Close (aio-persistence is accepted and
// ignored), clustering, or MQTT features beyond what mochi-mqtt provides. It
// does not hold messages back when a client's Receive Maximum is reached
// (mochi's flow control can deadlock, see hook.go); at most 8192 QoS 1
// messages are in flight to one client, and clients with the usual Receive
// Maximum of 65535 never notice. A client that does not read its messages
// fast enough eventually has messages dropped by the broker once its
// pending-write queue (8192 messages) is full, as any slow MQTT subscriber
// would.
package localstore
