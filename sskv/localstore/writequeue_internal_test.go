package localstore

import (
	"bufio"
	"encoding/binary"
	"net"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// TestWriteQueueFound fails if a mochi upgrade renames or retypes
// ClientState.outbound, the queue of pending writes whose length the store
// reads (see writequeue.go): the store would then fall back to a queue as
// long as MaxPendingMessages, 64 KiB per connection.
func TestWriteQueueFound(t *testing.T) {
	if !writeQueueKnown() {
		t.Fatal("mochi's ClientState.outbound (chan *packets.Packet) not found: writesQueued cannot work")
	}
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := dialQueueTest(t, srv.Addr(), "queue", 0)
	defer c.Close()
	c.subscribe(t, "queue/topic", 0) // once SUBACK comes, the session is established
	cl := srv.current("queue")
	q := reflect.ValueOf(&cl.State).Elem().Field(outboundField)
	if q.Cap() != writeQueueSize || writesQueued(cl) != 0 {
		t.Fatalf("queue of capacity %d holding %d, want %d and 0", q.Cap(), writesQueued(cl), writeQueueSize)
	}
}

// queueTestConn is a raw MQTT v5 connection that reads only when told to.
type queueTestConn struct {
	net.Conn
	r *bufio.Reader
}

func dialQueueTest(t *testing.T, addr, id string, rcvBuf int) *queueTestConn {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if rcvBuf > 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := &queueTestConn{Conn: nc, r: bufio.NewReader(nc)}
	rm := uint16(65535)
	if _, err := (&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true,
		KeepAlive: 600, Properties: &packets.Properties{ReceiveMaximum: &rm}}).WriteTo(c); err != nil {
		t.Fatal(err)
	}
	if p, err := packets.ReadPacket(c.r); err != nil || p.Type != packets.CONNACK || p.Content.(*packets.Connack).ReasonCode != 0 {
		t.Fatalf("%s: CONNACK expected, got %v, %v", id, p, err)
	}
	return c
}

// subscribe subscribes to filter at qos and waits for the SUBACK.
func (c *queueTestConn) subscribe(t *testing.T, filter string, qos byte) {
	t.Helper()
	if _, err := (&packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: filter, QoS: qos}},
		Properties: &packets.Properties{}}).WriteTo(c); err != nil {
		t.Fatal(err)
	}
	if p, err := packets.ReadPacket(c.r); err != nil || p.Type != packets.SUBACK {
		t.Fatalf("SUBACK expected, got %v, %v", p, err)
	}
}

// TestSlowReaderLosesNothing: a subscriber that stops reading while a
// publisher sends it far more than the broker's queue of pending writes
// holds gets every message, in order, once it reads again: the publisher
// waited for room instead of having the broker drop them.
func TestSlowReaderLosesNothing(t *testing.T) {
	srv, err := Start(Config{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	waited := make(chan struct{})
	var once sync.Once
	f := func(id string) {
		if id == "slow" {
			once.Do(func() { close(waited) })
		}
	}
	srv.onRoomWait.Store(&f)

	sub := dialQueueTest(t, srv.Addr(), "slow", 4096)
	defer sub.Close()
	// At QoS 0: a QoS 1 message waits on the client's lock while a write to
	// it is blocked (see writequeue.go), and never fills the queue.
	sub.subscribe(t, "slow/topic", 0)

	// Enough 64 KiB messages to fill the socket buffers and the queue.
	const n = 300
	pub := dialQueueTest(t, srv.Addr(), "publisher", 0)
	defer pub.Close()
	acks := make(chan error, 1)
	go func() {
		for range n {
			p, err := packets.ReadPacket(pub.r)
			if err != nil || p.Type != packets.PUBACK || p.Content.(*packets.Puback).ReasonCode != 0 {
				acks <- err
				return
			}
		}
		acks <- nil
	}()
	go func() {
		payload := make([]byte, 64<<10)
		for i := range n {
			binary.BigEndian.PutUint32(payload, uint32(i))
			if _, err := (&packets.Publish{QoS: 1, PacketID: uint16(i + 1), Topic: "slow/topic", Payload: payload,
				Properties: &packets.Properties{}}).WriteTo(pub); err != nil {
				return
			}
		}
	}()

	select {
	case <-waited:
	case <-time.After(time.Minute):
		t.Fatal("no sender ever waited for room: the test did not fill the queue")
	}
	for i := range n {
		_ = sub.SetReadDeadline(time.Now().Add(30 * time.Second))
		p, err := packets.ReadPacket(sub.r)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		m, ok := p.Content.(*packets.Publish)
		if !ok {
			t.Fatalf("message %d: got %v", i, p)
		}
		if got := binary.BigEndian.Uint32(m.Payload); got != uint32(i) {
			t.Fatalf("message %d: got message %d", i, got)
		}
	}
	if err := <-acks; err != nil {
		t.Fatalf("publisher: %v", err)
	}
	if d := srv.broker.Info.MessagesDropped; d != 0 {
		t.Fatalf("the broker dropped %d messages", d)
	}
}

// TestStuckReaderIsCut: a sender does not wait for ever on a subscriber
// that never reads: within Config.WriteTimeout the subscriber is
// disconnected and the publisher gets every PUBACK.
func TestStuckReaderIsCut(t *testing.T) {
	srv, err := Start(Config{WriteTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sub := dialQueueTest(t, srv.Addr(), "stuck", 4096)
	defer sub.Close()
	sub.subscribe(t, "stuck/topic", 1)
	const n = 300
	pub := dialQueueTest(t, srv.Addr(), "publisher", 0)
	defer pub.Close()
	go func() {
		payload := make([]byte, 64<<10)
		for i := range n {
			if _, err := (&packets.Publish{QoS: 1, PacketID: uint16(i + 1), Topic: "stuck/topic", Payload: payload,
				Properties: &packets.Properties{}}).WriteTo(pub); err != nil {
				return
			}
		}
	}()
	_ = pub.SetReadDeadline(time.Now().Add(time.Minute))
	for i := range n {
		p, err := packets.ReadPacket(pub.r)
		if err != nil || p.Type != packets.PUBACK {
			t.Fatalf("PUBACK %d: got %v, %v", i, p, err)
		}
	}
	if srv.Connected("stuck") {
		t.Fatal("the subscriber that never reads is still connected")
	}
}
