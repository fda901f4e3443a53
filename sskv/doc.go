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
// application from its environment (see [ConfigFromEnv]).
//
// # Requests
//
// [Client.Get], [Client.Set], [Client.Del] and [Client.VDel] each publish one
// request (QoS 1) and wait for its response. Any number of requests may be in
// flight on the connection at once; they are matched to their responses by
// correlation data. Each waits at most until its context's deadline, or
// Config.RequestTimeout when the context has none; the service is told the
// same bound as the request's Message Expiry (the time left, in whole
// seconds rounded up), and a broker drops a request whose expiry passes
// before it is delivered to the service (the local store does too). A
// request whose context has already ended is not sent at all.
//
// Outcomes that are not errors: a missing key (Found false), a SET whose
// condition was not met (Applied false, with the version of the value that
// stayed), a VDEL of another value (Mismatch true). A request the service
// refuses returns a *[ServiceError]; errors.Is matches it against ErrNotAuthorized,
// ErrFencingTokenLower and the other sentinels. An empty key is sent like any
// other, and the service's answer is [ErrKeyLengthZero]. Invalid options
// ([ErrInvalidOption]) are reported before anything is sent.
//
// Every request carries the client's HLC time (__ts). The client advances its
// clock with the versions the service returns, so the __ts it sends never
// goes backwards relative to what it has seen; the service refuses a __ts or
// fencing token more than a minute ahead of its own clock ([ErrTimestampSkew],
// [ErrFencingTokenSkew]), so keep clocks synchronised. Such a refusal is
// answered at once and not retried. The client's clock never goes back: a
// client whose system clock ran more than a minute ahead stays refused after
// the clock is set right, until real time passes the furthest time it read
// (or the client is recreated).
//
// # Connections, reconnects and requests in flight
//
// The client reconnects by itself, with a jittered exponential backoff
// (Config.ReconnectMin to ReconnectMax), re-reading Config.PasswordFile and
// Config.SATFile on every attempt. It resumes its MQTT session
// (Config.SessionExpiry must be positive), and subscribes again before any
// new request is sent. What a request sees across a connection loss:
//
//   - Sent while the connection is down: it waits for the next connection (at
//     most until its context ends). A request the client knows was never
//     handed to the connection is sent again, so it is never reported as not
//     executed when it might have been.
//   - In flight when the connection drops: the PUBLISH stays in the MQTT
//     session and is sent again after the reconnect, with its Message Expiry
//     set to the time its caller has left, if its caller still waits. The
//     response, held in the broker's session while the client was away, is
//     delivered after the reconnect. QoS 1 is at-least-once: an executor of
//     the Azure IoT Operations request/response protocol answers such a
//     repeat from a cache (by correlation data) rather than execute it
//     again, and the local state store does so for SET, DEL and VDEL. A
//     service that did execute it twice could undo another client's write
//     made in between (a DEL repeated after someone took the key), so this
//     client's locks never rely on it: their writes are fenced or
//     conditional on their own record. The client takes the first response.
//   - A request whose caller has given up (its context ended) is never sent
//     again. MQTT makes a resumed session resend every unacknowledged
//     PUBLISH, so the client resends it as a harmless read instead (a GET of
//     an empty key, which the service refuses without touching any key),
//     under correlation data nobody waits for: an abandoned SET cannot
//     create or extend a key after the fact.
//   - A request bound to a connection ([Conn]) is never sent on another one:
//     made after its connection was lost, it fails at once with [ErrNotSent]
//     (not executed); in flight when the connection drops, it is not sent
//     again, and fails with [ErrConnectionLost] once the next connection is
//     set up unless its answer came with the resumed session. Package lock
//     binds a holder's renewals to the connection on which it last checked
//     its key, so that no renewal reaches a store across an outage (a store
//     restart that lost the key, say) the holder has not checked.
//   - If the broker reports on reconnect that the session is gone (it
//     expired, or the broker lost it), responses to requests sent earlier can
//     never arrive: those requests fail at once with [ErrConnectionLost],
//     which means the outcome is unknown — the request may or may not have
//     been executed.
//   - A context that ends while a request is in flight likewise leaves its
//     outcome unknown; the request returns ctx's error (errors.Is works with
//     context.DeadlineExceeded and context.Canceled), and a response that
//     arrives later is dropped.
//
// No request ever waits past its context, whatever the socket does (a
// request does not wait for a write stuck on a full socket). Requests leave
// in the order they are made, through one writer that runs only while some
// are queued; a request still queued when its context ends is never sent.
// A request in flight costs no goroutine of the client's. (A client from
// [NewFromConnection] publishes each request on a goroutine of its own.) [Client.Close]
// fails requests in flight with [ErrClosed] and closes the socket within a
// short grace (250 ms) for its DISCONNECT.
//
// A request that returns an error after it was sent — a timeout,
// [ErrConnectionLost] — has an unknown outcome: the service may still
// execute it after the caller gave up. The client never sends it again, but
// the copy already on its way can arrive late: a frozen connection delivers
// what it held when the network heals, and a Message Expiry counts from
// the broker's receipt. Callers that hold leases must treat a timed-out
// acquire or renewal as possibly applied. The error of a request whose
// connection was lost meanwhile says so.
//
// # Dead connections
//
// The client finds a dead connection (a half-open one: a dead NAT mapping, a
// frozen peer, a partition that keeps the socket open) in a ping's time:
//
//   - Under traffic: a request that times out makes the client ping at once;
//     with no packet from the broker within Config.PingTimeout (default 1 s),
//     it drops the connection and reconnects. A dead connection is thus
//     replaced about PingTimeout after the first request that timed out
//     (measured: 1.0 s with the defaults), plus the reconnection.
//   - Idle, or with requests whose deadlines are long: the client pings when
//     nothing has been both sent and received for Config.KeepAlive (default
//     5 s), so a dead connection is found at most KeepAlive + PingTimeout
//     (6 s) after the last packet received from the broker.
//   - Writes: each packet is written with a deadline of KeepAlive +
//     PingTimeout, so no write blocks forever.
//
// Each connection attempt is bounded by KeepAlive + PingTimeout (at most
// Config.RequestTimeout). Packets from the broker larger than
// Config.MaxPacketSize end the connection before they are read.
//
// # Sizes
//
// MQTT forbids a client to send a packet larger than the broker's Maximum
// Packet Size (announced in its CONNACK; 4 MiB on the local store), and a
// broker closes the connection of one that does. A request that would be
// larger is not sent: it fails at once with a [*SizeError] wrapping
// [ErrTooLarge], and the connection, the other requests and the watches are
// left alone. A value can thus be a little smaller than the broker's limit
// (the request's key, topic and properties take a few hundred bytes).
//
// Whatever else makes a broker close the connection over a request (a
// DISCONNECT blaming a malformed or oversized packet, say), the resumed
// session stops sending the requests it has not had acknowledged after
// three such connections: they fail with [ErrConnectionLost] and are not
// sent again, so the client never reconnects in a loop. Connections lost
// otherwise do not count: a request whose caller still waits is sent again
// after any number of network cuts.
//
// # Watches
//
// [Client.Watch] registers a key with the service (KEYNOTIFY) and delivers
// its changes as [Event]s. The client subscribes to its notification topic,
// and waits for the broker's acknowledgement, before it registers any key.
// Watchers of the same key share one registration, ended when the last of
// them stops.
//
// What a watcher sees:
//
//   - Every change made after Watch returns, in version order, none twice.
//     DELETE notifications are accepted as "DELETE" and "DEL".
//   - After a reconnect the client registers every watched key again, reads
//     it, and delivers one Event with Resync set, carrying the key's current
//     value or its deletion, if the key changed while the connection was down
//     (the service ends watches on disconnect, so those changes cannot be
//     delivered one by one). An unchanged key produces no event, and a
//     watcher is never told the same state twice in a row. Changes the
//     service notifies between re-registration and that read are folded into
//     the Resync event. A read that finds the key missing while a
//     notification of it comes in is repeated: "not found" carries no
//     version to order it by. Registration and read are bound to the new
//     connection (a registration is never sent again on a later one, where
//     nobody would stop it), and a Watcher stopped meanwhile is unregistered
//     after them. When the broker has lost the client's session (it
//     restarted, most likely), the state the client reads next is taken as
//     news whatever its version: a restarted store, whose clock is the wall
//     clock, may give lower versions than its predecessor for a while.
//   - A slow consumer: each watcher buffers Config.WatchBuffer events (default
//     1024, allocated only while events wait; a channel watcher one more, in
//     its channel). Beyond that, its events are coalesced into one Resync event with
//     the key's latest known state, delivered after the buffered events as
//     soon as the consumer reads again. Nothing else waits for a slow watcher:
//     the connection, requests and other watchers go on, and memory stays
//     bounded. The last event a watcher receives always reflects the latest
//     state the client knows.
//
// A watch ends, and its channel is closed, on [Watcher.Stop], when the
// context given to Watch ends, when the client closes, or if the service
// refuses to register it again after a reconnect; [Watcher.Err] tells which.
// The context given to Watch bounds both the registration and the life of the
// watch (as in etcd's Watch). When it ends, the channel closes at once and
// the service's registration is ended in the background; [Watcher.Stop]
// instead returns only after the service has been told.
// [Client.WatchDetached] and [Client.WatchFuncDetached] take a context that
// bounds only the registration: the watch then lasts until Stop, for a
// watch that ends with something other than a context (a lease, say), at
// no cost of a context of its own.
//
// [Client.WatchFunc] is Watch with a function in place of the channel: it
// calls f with each event, one at a time, in order, and done once when the
// watch ends, with the same guarantees. It has no goroutine of its own; f
// and done run on the client's goroutines, often the one that receives the
// connection's packets, so they must return quickly and never wait for a
// request's answer. [Watcher.Handoff] turns a channel watcher into such a
// callback one, going on with the events its channel had not delivered.
// An idle watcher of either kind costs no goroutine and no buffer: a channel
// watcher's Events channel holds one event, which goes straight in when it
// is empty, and a goroutine forwards events only while more are pending.
//
// # Using an existing connection
//
// [NewFromConnection] builds a Client on an autopaho connection the
// application owns; the application then routes the connection's messages and
// events to it ([Client.HandlePublish], [Client.ConnectionUp],
// [Client.ConnectionDown]).
//
// # Errors
//
// Errors name the operation and the key once, with one "sskv: " prefix
// (`sskv: SET "k": state store error: ...`); errors.Is and errors.As find
// the sentinels, *[ServiceError], *[ConnectError] and context errors in them.
//
// # Logging
//
// The client logs through Config.Logger (log/slog; discarded by default): a
// lost and a restored connection at Info, each failed connection attempt at
// Debug, dropped malformed notifications and refused subscriptions at Warn.
// Late responses are logged at Debug only.
package sskv
