package sskv

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes  atomic.Int64
	fail    error
	writing chan struct{} // if not nil, closed at the first write
}

func (c *countingConn) Write(b []byte) (int, error) {
	if c.writes.Add(1) == 1 && c.writing != nil {
		close(c.writing)
	}
	if c.fail != nil {
		return 0, c.fail
	}
	return c.Conn.Write(b)
}

func publishPacket(i int) *packets.ControlPacket {
	cp := packets.NewControlPacket(packets.PUBLISH)
	pb := cp.Content.(*packets.Publish)
	pb.QoS, pb.PacketID, pb.Topic = 1, uint16(i+1), "t"
	pb.Payload = fmt.Appendf(nil, "packet %d", i)
	return cp
}

// Packets completed while a write to the socket is blocked go out together
// in the next write, whole and in the order they were completed, and each
// writer returns once its own packet is written.
func TestConnWritesPacketsTogether(t *testing.T) {
	const n = 50
	local, remote := net.Pipe()
	defer remote.Close()
	cc := &countingConn{Conn: local, writing: make(chan struct{})}
	mc := newMQTTConn(cc, cc, 0, time.Minute)
	defer mc.Close()

	// The first packet's write blocks: nobody reads the pipe yet.
	first := make(chan error, 1)
	go func() { _, err := publishPacket(0).WriteTo(mc); first <- err }()
	<-cc.writing
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		// The lock held here, each packet is queued in turn before its
		// writer waits in Unlock, so the order is known.
		mc.Lock()
		if _, err := publishPacket(i).WriteTo(writerOnly{mc}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); mc.Unlock() }()
	}

	got := make(chan error, 1)
	go func() {
		for i := range n {
			cp, err := packets.ReadPacket(remote)
			if err != nil {
				got <- err
				return
			}
			pb, ok := cp.Content.(*packets.Publish)
			if !ok || string(pb.Payload) != fmt.Sprintf("packet %d", i) {
				got <- fmt.Errorf("packet %d: read %v", i, cp)
				return
			}
		}
		got <- nil
	}()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if w := cc.writes.Load(); w != 2 {
		t.Errorf("%d packets took %d writes to the socket, want 2", n, w)
	}
}

// writerOnly hides the lock of the connection, which the test holds.
type writerOnly struct{ mc *mqttConn }

func (w writerOnly) Write(b []byte) (int, error) { return w.mc.Write(b) }

// A failed write closes the connection, releases every writer waiting for
// it, and fails every later write.
func TestConnWriteFailureIsSticky(t *testing.T) {
	local, remote := net.Pipe()
	defer remote.Close()
	cc := &countingConn{Conn: local, fail: errors.New("broken")}
	mc := newMQTTConn(cc, cc, 0, time.Minute)
	defer mc.Close()

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = publishPacket(i).WriteTo(mc) }()
	}
	wg.Wait()
	if _, err := publishPacket(9).WriteTo(mc); err == nil {
		t.Fatal("write after a failed write succeeded")
	}
	select {
	case <-mc.closed:
	default:
		t.Fatal("the connection is still open after a failed write")
	}
}

// countingReader counts the reads that reach the socket.
type countingReader struct {
	net.Conn
	reads atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(b)
}

// paho reads a packet in several small reads; the connection reads the
// socket ahead, so that packets that arrive together cost one read, and
// hands paho every byte before the socket's end.
func TestConnReadsAhead(t *testing.T) {
	const n = 100
	local, remote := net.Pipe()
	cr := &countingReader{Conn: local}
	mc := newMQTTConn(cr, cr, 0, time.Minute)
	defer mc.Close()
	go func() {
		var all bytesWriter
		if _, err := packets.NewControlPacket(packets.CONNACK).WriteTo(&all); err != nil {
			panic(err)
		}
		for i := range n {
			var b bytesWriter
			if _, err := publishPacket(i).WriteTo(&b); err != nil {
				panic(err)
			}
			all = append(all, b...)
		}
		_, _ = remote.Write(all)
		_ = remote.Close()
	}()
	if cp, err := packets.ReadPacket(mc); err != nil || cp.Type != packets.CONNACK {
		t.Fatalf("read %v, %v; want the CONNACK", cp, err)
	}
	for i := range n {
		cp, err := packets.ReadPacket(mc)
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if pb := cp.Content.(*packets.Publish); string(pb.Payload) != fmt.Sprintf("packet %d", i) {
			t.Fatalf("packet %d: read %q", i, pb.Payload)
		}
	}
	if _, err := packets.ReadPacket(mc); err == nil {
		t.Fatal("read a packet past the end of the stream")
	}
	// The stream (under 2 KiB) is one read, and its end another; net.Pipe
	// hands over at most what one read asks for.
	if r, most := cr.reads.Load(), int64(2); r > most {
		t.Errorf("%d packets took %d reads of the socket, want at most %d", n, r, most)
	}
}

type bytesWriter []byte

func (b *bytesWriter) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }
