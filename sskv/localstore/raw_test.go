package localstore_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// rawConn is an MQTT v5 connection driven packet by packet, with no client
// library deciding when to read, acknowledge or stop: what a paused, slow or
// hostile client does.
type rawConn struct {
	t     testing.TB
	id    string
	c     net.Conn
	r     *bufio.Reader
	clock *hlc.Clock
}

// dialRaw opens a TCP connection to addr. rcvBuf > 0 sets SO_RCVBUF before
// connecting, so that a client that stops reading fills its socket quickly.
func dialRaw(t testing.TB, addr string, rcvBuf int) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: waitTimeout}
	if rcvBuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

// connect sends CONNECT (clean start, the given keep-alive, Receive Maximum
// 65535 as the official SDKs state) and expects a successful CONNACK.
func (rc *rawConn) connect(id string, keepAlive uint16) *packets.Connack {
	rc.t.Helper()
	rc.id = id
	rc.clock, _ = hlc.NewClock(id)
	rm := uint16(65535)
	rc.write(&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true,
		KeepAlive: keepAlive, Properties: &packets.Properties{ReceiveMaximum: &rm}})
	p := rc.read()
	ca, ok := p.Content.(*packets.Connack)
	if !ok || ca.ReasonCode != 0 {
		rc.t.Fatalf("%s: CONNACK expected, got %v", id, p)
	}
	return ca
}

func (rc *rawConn) write(p interface {
	WriteTo(io.Writer) (int64, error)
}) {
	rc.t.Helper()
	_ = rc.c.SetWriteDeadline(time.Now().Add(waitTimeout))
	if _, err := p.WriteTo(rc.c); err != nil {
		rc.t.Fatalf("%s: write: %v", rc.id, err)
	}
}

// read reads the next packet, failing the test if none comes in waitTimeout.
func (rc *rawConn) read() *packets.ControlPacket {
	rc.t.Helper()
	p, err := rc.tryRead()
	if err != nil {
		rc.t.Fatalf("%s: read: %v", rc.id, err)
	}
	return p
}

func (rc *rawConn) tryRead() (*packets.ControlPacket, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(waitTimeout))
	return packets.ReadPacket(rc.r)
}

// request builds a state store request at QoS 1 with packet id id, whose
// correlation data is the packet id (so responses can be matched to it).
func (rc *rawConn) request(id uint16, respTopic string, args ...string) *packets.Publish {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	corr := binary.BigEndian.AppendUint16(nil, id)
	return &packets.Publish{QoS: 1, PacketID: id, Topic: wire.InvokeTopic, Payload: resp.AppendCommand(nil, b...),
		Properties: &packets.Properties{ResponseTopic: respTopic, CorrelationData: corr,
			User: []packets.User{{Key: wire.PropTimestamp, Value: rc.clock.Now().String()}}}}
}

// subscribe subscribes at QoS 1 and waits for the SUBACK.
func (rc *rawConn) subscribe(filter string) {
	rc.t.Helper()
	rc.write(&packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: filter, QoS: 1}},
		Properties: &packets.Properties{}})
	for {
		p := rc.read()
		if sa, ok := p.Content.(*packets.Suback); ok {
			if len(sa.Reasons) != 1 || sa.Reasons[0] > 2 {
				rc.t.Fatalf("subscribe %q refused: %v", filter, sa.Reasons)
			}
			return
		}
	}
}

// watch registers a KEYNOTIFY of key, answered on respTopic, and reads until
// the answer comes.
func (rc *rawConn) watch(respTopic, key string) {
	rc.t.Helper()
	rc.subscribe(respTopic)
	rc.write(rc.request(1, respTopic, "KEYNOTIFY", key))
	for {
		if p, ok := rc.read().Content.(*packets.Publish); ok && p.Topic == respTopic {
			return
		}
	}
}

// lengthHeader is a fixed header of the given packet type byte that declares
// a remaining length of n bytes (at most 268,435,455, MQTT's largest).
func lengthHeader(typ byte, n int) []byte {
	b := []byte{typ}
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// readUntilClosed reads and discards packets until the store closes the
// connection, and returns the DISCONNECT it sent, if any. It fails the test
// if the connection is still open after waitTimeout.
func (rc *rawConn) readUntilClosed() *packets.Disconnect {
	rc.t.Helper()
	d, err := rc.closed()
	if err != nil {
		rc.t.Fatal(err)
	}
	return d
}

// closed is readUntilClosed for goroutines other than the test's: it returns
// an error instead of failing the test.
func (rc *rawConn) closed() (*packets.Disconnect, error) {
	var d *packets.Disconnect
	for {
		p, err := rc.tryRead()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return d, fmt.Errorf("%s: connection still open after %v", rc.id, waitTimeout)
			}
			return d, nil
		}
		if x, ok := p.Content.(*packets.Disconnect); ok {
			d = x
		}
	}
}
