// Package faultproxy is a small TCP proxy for tests that injects network
// faults between a client and a server: it can blackhole the connections,
// delay them and cut them. The faults happen on the path, not in the server,
// so the same test works against any MQTT broker — a deployed Azure IoT
// Operations broker as well as the local store in
// [github.com/dsslock/dsslock/sskv/localstore].
//
// Start a proxy in front of the broker and give the client the proxy's
// address instead of the broker's:
//
//	p, err := faultproxy.Start("aio-broker:1883", faultproxy.Options{})
//	if err != nil { ... }
//	defer p.Close()
//	c, err := sskv.Dial(ctx, sskv.Config{Addr: p.Addr()})
//
// A proxy listens on 127.0.0.1 and forwards each connection it accepts to its
// target. The faults apply to every connection through it; to fault one
// client alone, give only that client the proxy's address, or give each
// client its own proxy.
//
// # What the client sees
//
//   - [Proxy.Blackhole]: a half-open path, as a dead NAT mapping, a
//     partition or a frozen peer leaves it. The connections open now stay
//     open and forward nothing in either direction; the client's writes
//     succeed until the buffers are full, then block. Nothing is closed, so
//     the client notices only through its own timers: its requests time
//     out, and its keep alive ping gets no answer (package sskv drops such a
//     connection PingTimeout after a request times out, or KeepAlive +
//     PingTimeout after the last packet when idle). The connection it then
//     makes is forwarded normally: a new connection takes a new path.
//     [Proxy.Heal] resumes the frozen connections and delivers what they
//     held, late, as after a partition heals.
//   - [Proxy.Cut]: both sockets of every connection are closed at once. The
//     client reads EOF or a connection reset at once and reconnects; the
//     broker sees its client gone without a DISCONNECT (for MQTT: it
//     publishes the client's will, if any, and keeps its session until the
//     session expiry).
//   - [Proxy.SetDelay]: latency. Every chunk of bytes is delivered a fixed
//     time after the proxy read it, in both directions, so a request and
//     its response each take that long more.
//
// [Proxy.Accepted] and [Proxy.Links] count the connections, for a test to
// wait until a client has reconnected.
//
// # What it does not do
//
//   - No packet loss, duplication, reordering or corruption: it forwards a
//     TCP byte stream, which arrives whole and in order (late, with a delay
//     or after a blackhole).
//   - It listens on loopback only, for clients on the same machine.
//   - One target per proxy; start one per broker. It forwards bytes and
//     knows nothing of MQTT or TLS: with TLS, the client verifies the
//     broker's certificate, so set tls.Config.ServerName to the broker's
//     name (sskv defaults it to the host of Addr, here 127.0.0.1).
//   - Delays are symmetric and apply to all connections alike.
//
// Every goroutine a proxy starts ends before [Proxy.Close] returns.
package faultproxy
