// Package sskv is a client for the Azure IoT Operations state store: a
// key-value service reached through the MQTT v5 broker, with RESP3 payloads,
// hybrid logical clock (HLC) versions and fencing tokens. It is the layer the
// locks and leader election of dsslock are built on.
//
// A [Client] holds one MQTT connection and keeps it up by itself:
//
//	c, err := sskv.Dial(ctx, sskv.Config{Addr: "aio-broker:18883", TLS: tlsCfg, SATFile: tokenPath})
//	if err != nil { ... }
//	defer c.Close()
//
//	res, err := c.Set(ctx, "lock", []byte("me"), sskv.SetOptions{
//		Condition: sskv.IfNotExists, Expiry: 10 * time.Second})
//	// res.Applied: the lock was free; res.Version: the fencing token
//
// In a pod, [DialEnv] reads the configuration Azure IoT Operations gives an
// application from its environment. [NewFromConnection] builds a Client on
// an autopaho connection the application owns. [Client.Get], [Client.Set],
// [Client.Del] and [Client.VDel] each send one request and wait for its
// answer; any number may be in flight. [Client.Watch] delivers a key's
// state, then its changes (KEYNOTIFY).
//
// # Results and errors
//
// Not errors: a missing key (Found false), a SET whose condition was not met
// (Applied false, with the version that stayed), a VDEL of another value
// (Mismatch true). A request the service refuses returns a *[ServiceError];
// errors.Is matches it against ErrNotAuthorized, ErrFencingTokenLower and the
// other sentinels. Invalid options ([ErrInvalidOption]) and requests larger
// than the broker's Maximum Packet Size ([ErrTooLarge]; the key, topic and
// properties take a few hundred bytes of it) fail before anything is sent. Errors name the operation and key once (`sskv: SET "k": ...`).
//
// A request that fails after it was sent (ctx's error, [ErrConnectionLost])
// has an unknown outcome: the service may execute it after the caller gave
// up, and a frozen connection may deliver it late. Callers that hold leases
// must treat a timed-out acquisition or renewal as possibly applied.
//
// # Guarantees
//
//   - No request waits past its context (or Config.RequestTimeout), whatever
//     the socket does; the service is told the same bound as the request's
//     Message Expiry. A request whose context has ended is never sent.
//   - Requests leave in the order they are made. One sent while the
//     connection is down waits for the next connection; one in flight when
//     it drops is sent again in the resumed session, and its answer taken
//     from there. The local store, as the service's request/response
//     executors do, answers such a repeat from a cache rather than execute
//     it twice; the locks never rely on it (their writes are fenced or
//     conditional).
//   - A request whose caller gave up is never sent again: the resumed
//     session resends it as a harmless read.
//   - A request bound to a connection ([Conn]) is never sent on another: it
//     fails with [ErrNotSent] (not executed) or [ErrConnectionLost].
//   - When the broker lost the session, requests sent earlier fail at once
//     with ErrConnectionLost. After three connections that the broker closed
//     over a request, the requests not yet acknowledged fail likewise, so
//     the client never reconnects in a loop.
//   - The client's HLC never goes backwards; the service refuses a __ts or
//     fencing token more than a minute ahead of its clock
//     ([ErrTimestampSkew], [ErrFencingTokenSkew]), at once, without retry. A
//     client whose clock ran ahead stays refused until real time catches up
//     with the furthest time it read (or it is recreated).
//   - A watcher first gets the key's state when it was registered
//     (Event.Initial), then every change after it, in version order, none
//     twice. What it may have missed (a reconnect, the broker
//     losing the session, a consumer slower than Config.WatchBuffer) comes
//     as one Event with Resync set, carrying the key's latest known state;
//     the last event always reflects the latest state the client knows.
//     Nothing else waits for a slow watcher. Watches are registered again
//     after each reconnect; [Watcher.Err] says why a watch ended.
//
// # What it assumes
//
//   - Clocks kept within a minute of the store's (NTP).
//   - The service answers a repeated request (QoS 1 redelivery) from a cache,
//     as the Azure IoT Operations executors do; one that executed it twice
//     could undo another client's write made in between.
//   - Callbacks given to the client return quickly and never wait for a
//     request's answer: they run on its goroutines.
//
// # Costs
//
// Measured on the local store; docs/benchmarks.md has the commands.
//
//	a request in flight            no goroutine (one each with NewFromConnection)
//	an idle watcher                no goroutine, no buffer
//	watchers of one key            one registration with the service
//	a dead connection, under load  replaced about PingTimeout (1 s) after a request times out
//	a dead connection, idle        found within KeepAlive + PingTimeout (6 s)
//	Close                          fails requests in flight (ErrClosed); 250 ms grace
//
// The client reconnects with a jittered exponential backoff
// (Config.ReconnectMin to ReconnectMax), re-reading Config.PasswordFile and
// Config.SATFile each time, and logs through Config.Logger (connection lost
// and restored at Info, failed attempts at Debug, dropped notifications at
// Warn). docs/design/sskv.md describes how requests, reconnects and watches
// work.
package sskv
