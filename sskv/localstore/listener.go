package localstore

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// connectTimeout bounds how long a new connection may take to send CONNECT.
const connectTimeout = 10 * time.Second

// listener is the broker's TCP (or TLS) listener. Unlike the broker's own, it
// tracks every accepted connection, so Close can cut connections that never
// finish (a client that never sends CONNECT or stops reading) and returns
// only when every connection goroutine has ended.
type listener struct {
	s     *Server
	id    string
	ln    net.Listener
	mu    sync.Mutex
	conns map[*deadlineConn]struct{}
	done  bool
	wg    sync.WaitGroup // the accept loop and one per connection
	serve chan struct{}  // closed when Serve returns
}

func listen(s *Server, id, addr string, cfg *tls.Config) (*listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("localstore: listen %s: %w", addr, err)
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	return &listener{s: s, id: id, ln: ln, conns: make(map[*deadlineConn]struct{}), serve: make(chan struct{})}, nil
}

func (l *listener) ID() string              { return l.id }
func (l *listener) Address() string         { return l.ln.Addr().String() }
func (l *listener) Protocol() string        { return "tcp" }
func (l *listener) Init(*slog.Logger) error { return nil }

// Serve accepts connections until Close.
func (l *listener) Serve(establish listeners.EstablishFn) {
	defer close(l.serve)
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.done {
			l.mu.Unlock()
			_ = conn.Close()
			return
		}
		dc := newDeadlineConn(conn, l.s)
		l.conns[dc] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		_ = dc.SetDeadline(time.Now().Add(connectTimeout))
		go func() {
			defer l.wg.Done()
			err := l.establish(establish, dc)
			_ = dc.Close()
			l.s.connectionDone(dc)
			dc.linger(lingerTimeout)
			l.mu.Lock()
			delete(l.conns, dc)
			l.mu.Unlock()
			switch {
			case errors.Is(err, errDecoderPanicked):
				l.s.log.Warn("closed connection: malformed packet", "remote", dc.RemoteAddr().String(), "error", err)
			case errors.Is(err, packets.ErrPacketTooLarge):
				l.s.log.Warn("closed connection: packet larger than the maximum packet size",
					"remote", dc.RemoteAddr().String(), "max_packet_size", l.s.cfg.MaxPacketSize)
			case err != nil:
				l.s.log.Debug("connection ended", "remote", dc.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

// establish runs the broker's handling of the connection dc, and survives a
// panic of the broker's packet decoder. mochi v2.7.9 panics on some
// malformed packets (a truncated MQTT 5 SUBSCRIBE indexes past its end:
// mochi-mqtt/server#501), and a panic in a connection's goroutine ends the
// process: any client could stop the store with a dozen bytes. The decoder
// works on the connection's own buffer and holds no lock, so the broker is
// sound after it panicked: the connection is closed, as for any malformed
// packet, and what the broker does after a failed read is done here
// (Server.malformed). A panic anywhere else goes on as it would have.
func (l *listener) establish(fn listeners.EstablishFn, dc *deadlineConn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if !panicIn(decoderPackage) {
				panic(p)
			}
			err = fmt.Errorf("%w: %v", errDecoderPanicked, p)
			l.s.malformed(dc, err)
		}
	}()
	return fn(l.id, dc)
}

// decoderPackage is the broker's packet codec: the code establish lets panic.
const decoderPackage = "github.com/mochi-mqtt/server/v2/packets."

var errDecoderPanicked = errors.New("localstore: the broker's packet decoder panicked on a malformed packet")

// panicIn reports whether the panic being recovered was raised in a function
// whose name begins with prefix. Called from a deferred function, it sees
// the stack as it was when the panic began: the first frame below
// runtime.gopanic that is not the runtime's own is where it was raised.
func panicIn(prefix string) bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	below := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			below = true
		case below && !strings.HasPrefix(f.Function, "runtime."):
			return strings.HasPrefix(f.Function, prefix)
		}
		if !more {
			return false
		}
	}
}

// malformed does for the connection dc, after the broker's decoder
// panicked on its input, what the broker does when a read fails: the client
// (if its session was set up) is disconnected, the store forgets its
// connection and watches, and a session that does not outlive its
// connection is removed. Its will message, if it had one, is not sent.
func (s *Server) malformed(dc *deadlineConn, err error) {
	cl := dc.client.Load()
	if cl == nil {
		return // the CONNECT itself was malformed: no session yet
	}
	cl.Stop(err)
	expire := (cl.Properties.ProtocolVersion == 5 && cl.Properties.Props.SessionExpiryInterval == 0) ||
		(cl.Properties.ProtocolVersion < 5 && cl.Properties.Clean)
	(&hook{s: s}).OnDisconnect(cl, err, expire)
	if expire && !cl.IsTakenOver() {
		cl.ClearInflights()
		s.broker.UnsubscribeClient(cl)
		s.broker.Clients.Delete(cl.ID)
	}
}

// Close stops accepting, sends every client a DISCONNECT, cuts whatever is
// left after the close timeout and waits for every connection goroutine.
func (l *listener) Close(listeners.CloseFn) {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return
	}
	l.done = true
	l.mu.Unlock()
	_ = l.ln.Close()
	<-l.serve

	deadline := time.Now().Add(l.s.cfg.CloseTimeout)
	l.mu.Lock()
	for c := range l.conns {
		_ = c.SetWriteDeadline(deadline) // a DISCONNECT must not block on a client that does not read
		if c.holding(FromStore) {
			_ = c.Close() // nor on a hold
		}
	}
	l.mu.Unlock()
	// The broker's own closeClients can deadlock: it read-locks its client
	// list twice, and a client leaving at the same time queues a writer in
	// between. Disconnect the listener's clients from our own records.
	disconnected := make(chan struct{})
	go func() {
		defer close(disconnected)
		l.s.disconnectAll(l.id)
	}()
	timer := time.NewTimer(l.s.cfg.CloseTimeout)
	select {
	case <-disconnected:
	case <-timer.C:
	}
	timer.Stop()
	l.mu.Lock()
	for c := range l.conns {
		c.closeNow()
	}
	l.mu.Unlock()
	<-disconnected
	l.wg.Wait()
}

// deadlineConn bounds every write to a client's socket by
// Config.WriteTimeout. mochi sets no write deadline of its own (only the
// keep-alive deadline, 1.5 x the keep-alive from the last packet read, and
// none at all for keep-alive 0), and it writes while holding the client's
// lock, which every publish to the client needs: without this a client that
// stops reading blocks every publish to it for as long as it stays
// connected. A write that does not complete in time may have left part of a
// packet on the wire, so the connection is closed: the client is gone, and
// the broker's read of the connection ends as for any dropped client.
//
// It is also where Server.Hold stops a connection's traffic (see gate).
type deadlineConn struct {
	net.Conn
	s        *Server
	limit    atomic.Int64 // a write deadline set from outside (Close), unix ns; 0: none
	broken   atomic.Bool
	closing  sync.Once
	gate     gate
	lastOut  atomic.Uint32               // packet id of the newest QoS message to the client (see packetid.go)
	inbound  atomic.Uint32               // the client packet being handled under another id (see setInbound)
	readAt   time.Time                   // when the PUBLISH being handled was read; only the connection's read goroutine uses it
	client   atomic.Pointer[mqtt.Client] // the broker's client, once its session is set up
	refusal  string                      // why the store refuses the client's CONNECT (see hook.OnConnectAuthenticate); only the connection's goroutine uses it
	claimed  string                      // the client id the connection claimed (see Server.admit), released when it ends; only the connection's goroutine uses it
	subQuota subQuota                    // the filters of the SUBSCRIBE being handled refused for MaxSubscriptionsPerClient; only the connection's goroutine uses it
	room     room                        // wakes senders waiting for room in the broker's queue of writes (see waitForRoom)

	// Writes to the socket, in order (see Write and acks).
	wmu      sync.Mutex
	acks     []byte      // PUBACKs held back to go out with the next write
	ackTimer *time.Timer // flushes acks if no write comes; made at the first ack held
	ackArmed bool        // ackTimer will fire

	// ackWait is the batch of writes to disk that the PUBACK the broker
	// writes next waits for (see Server.answerDurable); durable holds
	// PUBACKs waiting for their batch, in order, and every PUBACK after
	// them (guarded by wmu).
	ackWait atomic.Pointer[batch]
	durable []heldAck

	// heldOut is what was written while FromStore was held (see
	// Server.Hold), in order, to go out before any later write; heldBy is
	// the write deadline of its first byte, when heldTimer ends the
	// connection if it is still held back (guarded by wmu).
	heldOut   []byte
	heldBy    time.Time
	heldTimer *time.Timer
}

// heldAck is a PUBACK waiting for writes to disk (b; nil: for those of the
// PUBACKs before it).
type heldAck struct {
	b   *batch
	ack []byte
}

// ackFlushDelay bounds how long a PUBACK is held back when the write it
// waits for does not come (see deadlineConn.Write).
const ackFlushDelay = 5 * time.Millisecond

func newDeadlineConn(conn net.Conn, s *Server) *deadlineConn {
	c := &deadlineConn{Conn: conn, s: s}
	c.gate.closed = make(chan struct{})
	return c
}

var errWriteTimedOut = errors.New("localstore: an earlier write timed out; connection closed")

// Read reads from the socket, and returns what it read only once reads are
// not held (see Server.Hold). A read does not start while reads are held; one
// in progress when the hold begins keeps what it gets until the hold ends.
func (c *deadlineConn) Read(b []byte) (int, error) {
	if err := c.awaitReads(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		if herr := c.awaitReads(); herr != nil {
			return 0, herr // the connection ends: what was read does not matter
		}
	}
	return n, err
}

// Write writes b to the socket within Config.WriteTimeout (or the limit
// set by SetWriteDeadline, if sooner).
//
// A PUBACK (the broker's acknowledgement of a client's QoS 1 PUBLISH,
// which it writes itself, on the connection's read goroutine) written
// while the broker's queue of writes to the connection holds a packet is
// held back and goes out with the next write, which the broker's write
// loop makes for that packet: the acknowledgement of a request and its
// response then go out in one write, where they took two system calls. The
// broker's own coalescing of writes is off (see Start), as it can hold a
// DISCONNECT back until the connection is closed under it; here only
// PUBACKs wait, in order, and for at most ackFlushDelay should the
// queued packet not be written after all.
func (c *deadlineConn) Write(b []byte) (int, error) {
	defer c.room.signal() // the broker took a packet off its queue to write it
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.broken.Load() {
		return 0, errWriteTimedOut
	}
	if isPuback(b) {
		// The acknowledgement of a request waits until what its answer
		// waits for is durable, and PUBACKs go out in order.
		if w := c.ackWait.Swap(nil); w != nil && !w.finished() || len(c.durable) > 0 {
			c.durable = append(c.durable, heldAck{b: w, ack: bytes.Clone(b)})
			c.flushDurable()
			return len(b), nil
		}
		if cl := c.client.Load(); cl != nil && writesQueued(cl) > 0 {
			c.holdAck(b)
			return len(b), nil
		}
	}
	if len(c.acks) > 0 {
		acks := c.acks
		c.acks = c.acks[:0]
		if len(b) > maxCoalesced { // not worth copying
			if _, err := c.write(acks); err != nil {
				return 0, err
			}
			return c.write(b)
		}
		if _, err := c.write(append(acks, b...)); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.write(b)
}

// maxCoalesced is the largest packet that PUBACKs held back are copied in
// front of, to go out in one write; before a larger one they go out alone.
const maxCoalesced = 16 << 10

// isPuback reports whether b is one whole PUBACK packet: fixed header 0x40,
// remaining length 2 (packet id), 3 (and reason code) or 4 (and an empty
// property length).
func isPuback(b []byte) bool {
	return len(b) >= 4 && len(b) <= 6 && b[0] == 0x40 && int(b[1]) == len(b)-2
}

// holdAck holds the PUBACK b back for the next write, and makes sure it
// goes out within ackFlushDelay. The caller holds c.wmu.
func (c *deadlineConn) holdAck(b []byte) {
	c.acks = append(c.acks, b...)
	if c.ackArmed {
		return
	}
	c.ackArmed = true
	if c.ackTimer == nil {
		c.ackTimer = time.AfterFunc(ackFlushDelay, c.flushAcks)
		return
	}
	c.ackTimer.Reset(ackFlushDelay)
}

// releaseDurable writes the PUBACKs whose writes to disk are durable, in
// order (see Server.answerDurable).
func (c *deadlineConn) releaseDurable() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.flushDurable()
}

// flushDurable writes the PUBACKs at the head of c.durable whose batch is
// finished. The caller holds c.wmu.
func (c *deadlineConn) flushDurable() {
	n := 0
	var out []byte
	for ; n < len(c.durable); n++ {
		h := c.durable[n]
		if h.b != nil && !h.b.finished() {
			break
		}
		out = append(out, h.ack...)
	}
	if n == 0 {
		return
	}
	c.durable = append(c.durable[:0], c.durable[n:]...)
	if c.broken.Load() {
		return
	}
	if len(c.acks) > 0 { // PUBACKs held for coalescing came first
		out = append(c.acks, out...)
		c.acks = c.acks[:0]
	}
	_, _ = c.write(out)
}

// flushAcks writes the PUBACKs still held back, if any.
func (c *deadlineConn) flushAcks() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.ackArmed = false
	if len(c.acks) == 0 || c.broken.Load() {
		return
	}
	out := c.acks
	c.acks = nil
	_, _ = c.write(out)
}

// write writes b to the socket, as Write describes. The caller holds c.wmu.
//
// While FromStore is held, b is kept in c.heldOut and the write returns at
// once, as a write into a frozen network path's buffers would: the broker
// writes some packets (PUBACKs) on the connection's read goroutine, which
// must go on reading and executing the client's requests while their
// answers are held. What was held back goes out first once the hold ends,
// bounded by the write deadline of the first byte held; if the hold lasts
// past it, the connection is closed then, as for a write that timed out
// (see holdOut).
func (c *deadlineConn) write(b []byte) (int, error) {
	if c.broken.Load() {
		return 0, errWriteTimedOut
	}
	d := time.Now().Add(c.s.cfg.WriteTimeout)
	if l := c.limit.Load(); l != 0 && l < d.UnixNano() {
		d = time.Unix(0, l)
	}
	held, shut := c.gateState(FromStore)
	switch {
	case held && shut:
		return 0, net.ErrClosed
	case held:
		c.holdOut(b, d)
		return len(b), nil
	}
	size := len(b)
	if len(c.heldOut) > 0 { // the hold ended: what it held back goes first
		b = append(c.heldOut, b...)
		if c.heldBy.Before(d) {
			d = c.heldBy
		}
		c.heldOut = nil
		c.heldTimer.Stop()
	}
	_ = c.Conn.SetWriteDeadline(d)
	n, err := c.Conn.Write(b)
	if err != nil && !c.broken.Swap(true) {
		if isTimeout(err) {
			c.s.log.Warn("closed connection: client not reading, a write did not complete in time",
				"remote", c.RemoteAddr().String(), "write_timeout", c.s.cfg.WriteTimeout, "bytes", len(b), "written", n)
		}
		_ = c.Close()
	}
	return min(n, size), err
}

// holdOut keeps b, written while FromStore is held, for when the hold ends,
// and makes sure the connection is closed if the first byte held is still
// held back at its write deadline d. The caller holds c.wmu.
func (c *deadlineConn) holdOut(b []byte, d time.Time) {
	if len(c.heldOut) == 0 {
		c.heldBy = d
		if c.heldTimer == nil {
			c.heldTimer = time.AfterFunc(time.Until(d), c.heldExpired)
		} else {
			c.heldTimer.Reset(time.Until(d))
		}
	}
	c.heldOut = append(c.heldOut, b...)
}

// heldExpired closes the connection if what FromStore held back is still
// not written at its write deadline.
func (c *deadlineConn) heldExpired() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.heldOut) == 0 || time.Now().Before(c.heldBy) || c.broken.Swap(true) {
		return // written in time, or a later hold's timer
	}
	c.s.log.Warn("closed connection: writes held past the write timeout",
		"remote", c.RemoteAddr().String(), "write_timeout", c.s.cfg.WriteTimeout, "bytes", len(c.heldOut))
	c.heldOut = nil
	_ = c.Close()
}

// flushHeld writes what FromStore held back, if it was not written yet.
func (c *deadlineConn) flushHeld() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.heldOut) > 0 && !c.broken.Load() {
		_, _ = c.write(nil)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// lingerTimeout bounds how long a closed connection is read (and discarded)
// so that the client gets what was sent before the close; see Close.
const lingerTimeout = 2 * time.Second

// Close is what the broker calls to end a connection (Client.Stop). It does
// not close the socket at once: a socket closed while the client's unread
// requests sit in its receive buffer sends a TCP RST, and the client's
// kernel then discards whatever the client had not read yet, the
// DISCONNECT with its reason code and the last responses included. Close
// instead sends FIN after everything written, and wakes the broker's read of
// the connection (which a plain close used to do); linger, once the broker
// has finished with the connection, reads until the client closes its side
// (or lingerTimeout) and then closes the socket.
func (c *deadlineConn) Close() error {
	c.closing.Do(func() {
		c.shutGate()
		tcp, _ := c.Conn.(*net.TCPConn)
		if tc, ok := c.Conn.(*tls.Conn); ok {
			tcp, _ = tc.NetConn().(*net.TCPConn)
		}
		if tcp == nil || tcp.CloseWrite() != nil {
			_ = c.Conn.Close()
			return
		}
		_ = c.Conn.SetReadDeadline(time.Now())
	})
	return nil
}

// linger discards what the client still sends for at most d, until it
// closes its side, then closes the socket. closeNow cuts it short.
func (c *deadlineConn) linger(d time.Duration) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(d))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.Conn, 64<<20))
	_ = c.Conn.Close()
}

// closeNow closes the socket at once.
func (c *deadlineConn) closeNow() {
	c.closing.Do(func() {})
	c.shutGate()
	_ = c.Conn.Close()
}

// SetDeadline sets the read deadline only: mochi calls it with its keep-alive
// deadline, which must not lengthen the bound on writes. A held read obeys it
// too.
func (c *deadlineConn) SetDeadline(t time.Time) error { return c.setReadDeadline(t) }

// SetWriteDeadline sets an absolute limit that every later write also obeys.
func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	if t.IsZero() {
		c.limit.Store(0)
	} else {
		c.limit.Store(t.UnixNano())
	}
	return nil
}

// connRec is an authenticated connection of a client id.
type connRec struct {
	id     string
	cl     *mqtt.Client
	done   chan struct{} // closed when the broker has finished with the connection
	out    outbox        // notifications waiting to be published
	doomed atomic.Bool   // being disconnected by the store (see cut): nothing more is queued for it
}

// takeOverTimeout bounds how long a new connection waits for the older
// connection of its client id to be finished with.
const takeOverTimeout = 5 * time.Second

// takeOver makes cl the newest connection of its client id, and first
// disconnects the older one and waits until the broker has finished with it.
//
// The broker tears down an ended connection (unsubscribing its client id's
// topics, removing the id from its client list) concurrently with a new
// connection of the same id setting up, and that teardown can remove the new
// session's subscriptions or client entry: its responses would then be lost.
// A client that reconnects at once after a dropped connection hits this.
// Serialising the two per client id removes the race.
func (s *Server) takeOver(cl *mqtt.Client) {
	rec := &connRec{id: cl.ID, cl: cl, done: make(chan struct{})}
	s.connMu.Lock()
	prev := s.latest[cl.ID]
	s.latest[cl.ID] = rec
	s.recs[cl.Net.Conn] = rec
	s.connMu.Unlock()
	if prev == nil {
		return
	}
	cutHeld(prev.cl)
	_ = s.broker.DisconnectClient(prev.cl, packets.ErrSessionTakenOver)
	t := time.NewTimer(takeOverTimeout)
	defer t.Stop()
	select {
	case <-prev.done:
	case <-t.C:
		s.log.Warn("older connection of the client id still not finished; going on", "client", cl.ID)
	}
}

// disconnectAll sends DISCONNECT (server shutting down) to every client
// connected through the listener with the given id, and closes them.
func (s *Server) disconnectAll(listenerID string) {
	s.connMu.Lock()
	var cls []*mqtt.Client
	for _, rec := range s.recs {
		if rec.cl.Net.Listener == listenerID {
			cls = append(cls, rec.cl)
		}
	}
	s.connMu.Unlock()
	for _, cl := range cls {
		_ = s.broker.DisconnectClient(cl, packets.ErrServerShuttingDown)
	}
}

// connectionDone runs after the broker has finished with a connection.
func (s *Server) connectionDone(conn net.Conn) {
	if dc, ok := conn.(*deadlineConn); ok && dc.claimed != "" {
		s.tenants.release(dc.claimed)
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	rec, ok := s.recs[conn]
	if !ok {
		return
	}
	delete(s.recs, conn)
	if s.latest[rec.id] == rec {
		delete(s.latest, rec.id)
	}
	close(rec.done)
}
