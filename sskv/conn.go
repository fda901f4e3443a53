package sskv

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
)

// Errors of the byte stream the broker sends, found by the client's
// connection before paho reads a packet.
var (
	// ErrPacketTooLarge reports a packet from the broker whose declared size
	// exceeds Config.MaxPacketSize. The client closes the connection before
	// reading (or allocating) the packet.
	ErrPacketTooLarge = errors.New("sskv: packet from the broker exceeds MaxPacketSize")

	// ErrNotMQTT reports a server whose first answer to CONNECT is not an
	// MQTT CONNACK or AUTH packet (or is a malformed CONNACK): the address
	// is not an MQTT v5 broker, or TLS is expected on one side only. Dial
	// fails at once on it.
	ErrNotMQTT = errors.New("sskv: the server does not speak MQTT v5")
)

// MQTT control packet types the connection needs to know.
const (
	pktConnack = 2
	pktAuth    = 15
)

// frameScanner follows the MQTT fixed headers in a byte stream without
// copying it: it reads each packet's type byte and Remaining Length and
// skips the rest of the packet.
type frameScanner struct {
	inHeader  bool   // between the type byte and the end of the Remaining Length
	typ       byte   // type of the current packet (high nibble of its first byte)
	vbiLen    uint8  // Remaining Length bytes read so far
	length    uint32 // Remaining Length decoded so far
	remaining uint32 // bytes of the current packet's body still to come
	packets   uint32 // packets whose header was complete, saturating
	first     byte   // type of the stream's first packet
	maxSize   uint32 // the largest whole packet allowed; 0: no limit
}

// scan advances over b. It returns an error, and stops, at a packet that
// is malformed or larger than s.maxSize, as soon as its header shows it.
// first, when not nil, judges the first byte of the stream.
func (s *frameScanner) scan(b []byte, first func(byte) error) error {
	for i := 0; i < len(b); {
		switch {
		case s.remaining > 0:
			k := min(uint32(len(b)-i), s.remaining)
			s.remaining -= k
			i += int(k)
		case !s.inHeader:
			if s.packets == 0 && first != nil {
				if err := first(b[i]); err != nil {
					return err
				}
			}
			s.typ = b[i] >> 4
			if s.packets == 0 {
				s.first = s.typ
			}
			if s.typ == 0 {
				return fmt.Errorf("%w: reserved packet type 0", ErrNotMQTT)
			}
			s.inHeader, s.vbiLen, s.length = true, 0, 0
			i++
		default:
			d := b[i]
			i++
			s.length |= uint32(d&0x7f) << (7 * s.vbiLen)
			s.vbiLen++
			size := uint64(s.length) + 1 + uint64(s.vbiLen)
			if s.maxSize > 0 && size > uint64(s.maxSize) {
				return fmt.Errorf("%w: a packet of type %d declares %d bytes or more, the limit is %d", ErrPacketTooLarge, s.typ, size, s.maxSize)
			}
			if d&0x80 == 0 {
				s.inHeader = false
				s.remaining = s.length
				if s.packets < ^uint32(0) {
					s.packets++
				}
			} else if s.vbiLen == 4 {
				return fmt.Errorf("%w: malformed Remaining Length", ErrNotMQTT)
			}
		}
	}
	return nil
}

// atBoundary reports whether the scanner is between two packets.
func (s *frameScanner) atBoundary() bool { return !s.inHeader && s.remaining == 0 }

// mqttConn is the network connection of one MQTT connection, as paho sees
// it. It guards the client against the broker's byte stream and against a
// socket that stops moving:
//
//   - Read checks each packet's declared size against the limit before
//     paho sees the header (paho allocates a packet's declared size before
//     reading it), and checks that the server answers CONNECT in MQTT.
//   - Writes are packet-atomic (it is the sync.Locker paho's WriteTo takes),
//     and each write to the socket has a deadline, so no write blocks for
//     longer than writeTimeout.
//   - Packets completed while a write to the socket is in progress go out
//     together in the next one (a group commit): a burst of requests and
//     acknowledgements costs the client and the broker a few system calls,
//     not one each. Each writer still returns only once its own packet is
//     on the socket (or the connection has failed).
//
// Any failure closes the connection; the error is then sticky.
type mqttConn struct {
	net.Conn
	raw          net.Conn // the TCP connection under Conn (Conn itself without TLS)
	writeTimeout time.Duration

	// Read side: only paho's reading goroutine reads. paho reads a packet
	// in three reads or more (type, length, body), so the socket is read
	// ahead into rbuf: a burst of answers costs a few system calls.
	rs         frameScanner
	rerr       error
	rbuf       []byte // read ahead: rbuf[rpos:rend] is not yet handed to paho
	rpos, rend int
	rbufErr    error         // the error that came with the bytes read ahead
	connack    atomic.Bool   // the first packet, a CONNACK, was read whole
	answered   atomic.Bool   // the first packet was read whole; the answer deadline is cleared
	answerBy   time.Duration // how long the attempt waits for the server's answer (see Client.answerBound)

	// Packet side, guarded by wmu, which paho holds across each packet.
	wmu     sync.Mutex
	ws      frameScanner
	wbuf    []byte // the packet being written
	waitSeq uint64 // the queued packet that Unlock waits for, if not 0

	// Socket side, guarded by gmu.
	gmu        sync.Mutex
	written    sync.Cond // L is &gmu; signalled when a write to the socket ends
	queued     []byte    // whole packets waiting for the next write
	spare      []byte    // the buffer of the last write, reused for queued
	queuedSeq  uint64    // packets queued so far
	writtenSeq uint64    // packets whose write has ended so far
	writing    bool      // a write to the socket is in progress
	werr       error
	flushStart atomic.Int64 // UnixNano when the write in progress began; 0 when none

	closeOnce sync.Once
	closed    chan struct{}
}

// maxKeptWriteBuffer bounds the write buffer kept between packets.
const maxKeptWriteBuffer = 64 << 10

func newMQTTConn(nc, raw net.Conn, maxPacket uint32, writeTimeout time.Duration) *mqttConn {
	c := &mqttConn{Conn: nc, raw: raw, rs: frameScanner{maxSize: maxPacket}, writeTimeout: writeTimeout, closed: make(chan struct{})}
	c.written.L = &c.gmu
	return c
}

// Read reads from the connection, failing (and closing it) at a packet
// that is too large or not MQTT.
func (c *mqttConn) Read(p []byte) (int, error) {
	if c.rerr != nil {
		return 0, c.rerr
	}
	n, err := c.readAhead(p)
	if n > 0 {
		if serr := c.rs.scan(p[:n], firstFromServer); serr != nil {
			c.rerr = serr
			c.abort()
			return 0, serr
		}
		if !c.answered.Load() && (c.rs.packets > 1 || c.rs.packets == 1 && c.rs.atBoundary()) {
			if c.rs.first == pktConnack {
				c.connack.Store(true)
			}
			_ = c.Conn.SetReadDeadline(time.Time{}) // the server answered: clear Config.HandshakeTimeout's deadline
			c.answered.Store(true)
		}
	}
	return n, err
}

// readBufferSize is how much the connection reads ahead of paho at most.
const readBufferSize = 4 << 10

// readAhead reads into p what was read ahead, or else reads the socket,
// ahead of p when p is small.
func (c *mqttConn) readAhead(p []byte) (int, error) {
	if c.rpos == c.rend {
		if err := c.rbufErr; err != nil {
			c.rbufErr = nil
			return 0, err
		}
		if len(p) >= readBufferSize {
			return c.Conn.Read(p)
		}
		if c.rbuf == nil {
			c.rbuf = make([]byte, readBufferSize)
		}
		m, err := c.Conn.Read(c.rbuf)
		c.rpos, c.rend = 0, m
		if m == 0 {
			return 0, err
		}
		c.rbufErr = err
	}
	n := copy(p, c.rbuf[c.rpos:c.rend])
	c.rpos += n
	return n, nil
}

// firstFromServer checks the first byte a broker sends after CONNECT.
func firstFromServer(b byte) error {
	switch t := b >> 4; {
	case b == pktConnack<<4 || b == pktAuth<<4:
		return nil
	case b == 0x15 || b == 0x16:
		return fmt.Errorf("%w: its answer looks like TLS (record type 0x%02x); use TLS to connect", ErrNotMQTT, b)
	case b == 'H':
		return fmt.Errorf("%w: its answer looks like HTTP", ErrNotMQTT)
	default:
		return fmt.Errorf("%w: it answered CONNECT with packet type %d (flags 0x%x), not CONNACK", ErrNotMQTT, t, b&0xf)
	}
}

// Lock and Unlock make paho's packet writes atomic: paho's WriteTo holds
// the lock across the several writes of one packet.
func (c *mqttConn) Lock() { c.wmu.Lock() }

// Unlock queues anything still buffered (a packet whose header did not
// announce its end), releases the lock, and waits until the packet is on
// the socket. A failed write closes the connection: paho, which has had
// its WriteTo's answer, finds it at its next read or write.
func (c *mqttConn) Unlock() {
	if len(c.wbuf) > 0 {
		c.ws = frameScanner{}
		c.enqueue()
	}
	seq := c.waitSeq
	c.waitSeq = 0
	c.wmu.Unlock()
	if seq != 0 {
		_ = c.awaitWritten(seq)
	}
}

// Write buffers p and, once the packet it belongs to is complete, queues
// it for the socket. Callers hold the lock (paho's WriteTo does); Unlock
// waits for the write.
func (c *mqttConn) Write(p []byte) (int, error) {
	c.gmu.Lock()
	err := c.werr
	c.gmu.Unlock()
	if err != nil {
		return 0, err
	}
	c.wbuf = append(c.wbuf, p...)
	if err := c.ws.scan(p, nil); err != nil {
		// Our own packet: paho never writes one this malformed; send it
		// anyway and let the broker judge.
		c.ws = frameScanner{}
		c.enqueue()
	} else if c.ws.atBoundary() {
		c.enqueue()
	}
	return len(p), nil
}

// enqueue moves the packet in wbuf to the queue of the next write. c.wmu
// is held.
func (c *mqttConn) enqueue() {
	c.gmu.Lock()
	if c.werr == nil {
		if c.queued == nil {
			c.queued, c.spare = c.spare[:0], nil
		}
		c.queued = append(c.queued, c.wbuf...)
		c.queuedSeq++
		c.waitSeq = c.queuedSeq
	}
	c.gmu.Unlock()
	if cap(c.wbuf) > maxKeptWriteBuffer {
		c.wbuf = nil
	} else {
		c.wbuf = c.wbuf[:0]
	}
}

// awaitWritten returns once the write of queued packet seq has ended, with
// the connection's write error, if any. While no write is in progress, the
// caller writes everything queued so far itself, its own packet included.
func (c *mqttConn) awaitWritten(seq uint64) error {
	c.gmu.Lock()
	defer c.gmu.Unlock()
	for c.writtenSeq < seq && c.werr == nil {
		if c.writing {
			c.written.Wait()
			continue
		}
		buf, upto := c.queued, c.queuedSeq
		c.queued = nil
		c.writing = true
		c.gmu.Unlock()
		err := c.writeOut(buf)
		c.gmu.Lock()
		c.writing = false
		c.writtenSeq = upto
		if cap(buf) <= maxKeptWriteBuffer {
			c.spare = buf
		}
		if err != nil && c.werr == nil {
			c.werr = fmt.Errorf("write: %w", err)
		}
		c.written.Broadcast()
	}
	return c.werr
}

// writeOut writes b to the socket, bounded by writeTimeout, and closes the
// connection if that fails.
func (c *mqttConn) writeOut(b []byte) error {
	now := time.Now()
	_ = c.Conn.SetWriteDeadline(now.Add(c.writeTimeout))
	c.flushStart.Store(now.UnixNano())
	_, err := c.Conn.Write(b)
	c.flushStart.Store(0)
	if err != nil {
		c.abort()
	}
	return err
}

// Close closes the socket, at once: a TLS close_notify alert is not sent
// (it could wait on a stalled socket; MQTT's DISCONNECT, when there is
// one, has been written before). It is idempotent.
func (c *mqttConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		err = c.raw.Close()
	})
	return err
}

// abort closes a connection given up for dead: data still unsent is
// discarded and the peer gets a reset, rather than the kernel trying to
// deliver it for minutes to a peer that does not answer.
func (c *mqttConn) abort() {
	if tc, ok := c.raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// abortConn aborts conn when it is an *mqttConn, and closes it otherwise.
func abortConn(conn net.Conn) {
	if mc, ok := conn.(*mqttConn); ok {
		mc.abort()
		return
	}
	_ = conn.Close()
}

// attemptConnection is autopaho's AttemptConnection: it opens the TCP (and
// TLS) connection of one connection attempt and wraps it. autopaho hands it
// its outer context, so it bounds the attempt itself.
func (c *Client) attemptConnection(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
	c.conn.Store(nil)
	ctx, cancel := context.WithTimeout(ctx, c.connectTimeout())
	defer cancel()
	answerBy := c.answerBound()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	nc := raw
	if c.cfg.TLS != nil {
		tc := c.cfg.TLS
		if tc.ServerName == "" {
			tc = tc.Clone()
			if host, _, err := net.SplitHostPort(u.Host); err == nil {
				tc.ServerName = host
			}
		}
		tlsConn := tls.Client(raw, tc)
		hctx, hcancel := context.WithTimeout(ctx, answerBy)
		err := tlsConn.HandshakeContext(hctx)
		hcancel()
		if err != nil {
			_ = raw.Close()
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, &noAnswerError{fmt.Sprintf("connected to %s, but no TLS answer within %v: is it a TLS port?", raw.RemoteAddr(), answerBy), err}
			}
			return nil, c.tlsHandshakeError(ctx, u.Host, err)
		}
		nc = tlsConn
	}
	mc := newMQTTConn(nc, raw, uint32(c.cfg.MaxPacketSize), c.writeTimeout())
	mc.answerBy = answerBy
	if answerBy < c.connectTimeout() {
		_ = nc.SetReadDeadline(time.Now().Add(answerBy)) // cleared by Read once the server answers
	}
	c.conn.Store(mc)
	return mc, nil
}

// answerBound is how long a connection attempt waits for each answer of the
// server (the TLS handshake, CONNACK): Config.HandshakeTimeout in Dial's
// attempts, when it is shorter than the attempt's own bound. Reconnections
// wait as long as ever: a broker slow to answer after an outage is not cut
// short.
func (c *Client) answerBound() time.Duration {
	d := c.connectTimeout()
	if ht := c.cfg.HandshakeTimeout; ht > 0 && ht < d && c.state.Load().gen == 0 {
		d = ht
	}
	return d
}

// connectTimeout bounds one connection attempt, CONNACK included: a live
// broker answers within a ping's time, and a shorter attempt finds a healed
// network sooner.
func (c *Client) connectTimeout() time.Duration {
	return min(c.cfg.RequestTimeout, c.cfg.KeepAlive+c.cfg.PingTimeout)
}

// writeTimeout bounds the write of one packet. A connection whose writes
// stall this long has also gone a keep-alive without an answer to a ping.
func (c *Client) writeTimeout() time.Duration {
	return c.cfg.KeepAlive + c.cfg.PingTimeout
}
