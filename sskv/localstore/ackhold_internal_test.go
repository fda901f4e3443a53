package localstore

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// recordConn is a socket that records each write it is given.
type recordConn struct {
	net.Conn // nil: only what deadlineConn's writes use is implemented
	mu       sync.Mutex
	writes   [][]byte
	wrote    chan struct{} // a write was recorded
}

func (r *recordConn) Write(b []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, bytes.Clone(b))
	r.mu.Unlock()
	select {
	case r.wrote <- struct{}{}:
	default:
	}
	return len(b), nil
}

func (r *recordConn) SetWriteDeadline(time.Time) error { return nil }

// take returns the writes recorded since the last take.
func (r *recordConn) take() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.wrote:
	default:
	}
	w := r.writes
	r.writes = nil
	return w
}

// TestPubackRidesWithNextWrite: a PUBACK written while the broker's queue of
// writes to the connection holds a packet waits for the next write (the
// queued packet's) and goes out in the same one, in order with any other
// PUBACK held; with nothing queued, or no write coming, it goes out alone,
// at once or after ackFlushDelay.
func TestPubackRidesWithNextWrite(t *testing.T) {
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

	// A subscriber that does not read, and a publisher that fills its
	// queue of pending writes: a client whose queue holds packets.
	slow := dialQueueTest(t, srv.Addr(), "slow", 4096)
	defer slow.Close()
	slow.subscribe(t, "slow/topic", 0)
	pub := dialQueueTest(t, srv.Addr(), "publisher", 0)
	defer pub.Close()
	go func() {
		payload := make([]byte, 64<<10)
		for range 300 {
			if _, err := (&packets.Publish{QoS: 0, Topic: "slow/topic", Payload: payload,
				Properties: &packets.Properties{}}).WriteTo(pub); err != nil {
				return
			}
		}
	}()
	select {
	case <-waited:
	case <-time.After(time.Minute):
		t.Fatal("the subscriber's queue never filled")
	}
	busy := srv.current("slow")
	if writesQueued(busy) == 0 {
		t.Fatal("the subscriber's queue is empty")
	}
	idle := dialQueueTest(t, srv.Addr(), "idle", 0)
	defer idle.Close()
	idle.subscribe(t, "idle/topic", 0)

	puback := func(id uint16) []byte {
		var b bytes.Buffer
		if _, err := (&packets.Puback{PacketID: id, ReasonCode: 0, Properties: &packets.Properties{}}).WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		if !isPuback(b.Bytes()) {
			t.Fatalf("isPuback(% x) = false", b.Bytes())
		}
		return b.Bytes()
	}
	rec := &recordConn{wrote: make(chan struct{}, 1)}
	dc := newDeadlineConn(rec, srv)
	dc.client.Store(busy)
	write := func(b []byte) {
		t.Helper()
		if n, err := dc.Write(b); n != len(b) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}

	// Held, in order, and out with the next packet.
	write(puback(1))
	write(puback(2))
	if w := rec.take(); len(w) != 0 {
		t.Fatalf("PUBACKs written at once while a packet was queued: %d writes", len(w))
	}
	next := []byte{0x30, 0x03, 0x00, 0x01, 'x'} // a PUBLISH
	write(next)
	want := append(append(puback(1), puback(2)...), next...)
	if w := rec.take(); len(w) != 1 || !bytes.Equal(w[0], want) {
		t.Fatalf("writes %x, want one: %x", w, want)
	}

	// Held, and no write comes: it goes out alone, soon.
	write(puback(3))
	select {
	case <-rec.wrote:
	case <-time.After(time.Minute):
		t.Fatal("a held PUBACK never went out")
	}
	if w := rec.take(); len(w) != 1 || !bytes.Equal(w[0], puback(3)) {
		t.Fatalf("writes %x, want the PUBACK alone", w)
	}

	// Nothing queued: out at once.
	dc.client.Store(srv.current("idle"))
	write(puback(4))
	if w := rec.take(); len(w) != 1 || !bytes.Equal(w[0], puback(4)) {
		t.Fatalf("writes %x, want the PUBACK at once", w)
	}
}
