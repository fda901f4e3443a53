package localstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// quiet is how long these tests watch for something that must not happen:
// there is no event to wait on for "nothing".
const quiet = 300 * time.Millisecond

// stream reads rc's packets in a goroutine, with no deadline, until the
// connection ends; the channel is then closed.
func stream(rc *rawConn) <-chan *packets.ControlPacket {
	ch := make(chan *packets.ControlPacket, 1024)
	_ = rc.c.SetReadDeadline(time.Time{})
	go func() {
		defer close(ch)
		for {
			p, err := packets.ReadPacket(rc.r)
			if err != nil {
				return
			}
			ch <- p
		}
	}()
	return ch
}

// nothing fails the test if a packet arrives on ch within quiet.
func nothing(t *testing.T, ch <-chan *packets.ControlPacket) {
	t.Helper()
	select {
	case p, ok := <-ch:
		if ok {
			t.Fatalf("got %v while held", p)
		}
		t.Fatal("connection ended while held")
	case <-time.After(quiet):
	}
}

// nextPacket returns the next packet on ch.
func nextPacket(t *testing.T, ch <-chan *packets.ControlPacket) *packets.ControlPacket {
	t.Helper()
	select {
	case p, ok := <-ch:
		if !ok {
			t.Fatal("connection ended")
		}
		return p
	case <-time.After(waitTimeout):
		t.Fatalf("no packet within %v", waitTimeout)
		return nil
	}
}

// answers reads the PUBACK and the response of each of n requests sent
// with packet ids 1..n (see rawConn.request), and returns the responses'
// packet ids in the order they arrived, with their payloads.
func answers(t *testing.T, ch <-chan *packets.ControlPacket, n int) (order []uint16, payloads map[uint16]string) {
	t.Helper()
	payloads = map[uint16]string{}
	acks := 0
	for acks < n || len(order) < n {
		switch p := nextPacket(t, ch).Content.(type) {
		case *packets.Puback:
			if p.ReasonCode != 0 {
				t.Fatalf("PUBACK %d: reason 0x%02x", p.PacketID, p.ReasonCode)
			}
			acks++
		case *packets.Publish:
			id := binary.BigEndian.Uint16(p.Properties.CorrelationData)
			order = append(order, id)
			payloads[id] = string(p.Payload)
		}
	}
	return order, payloads
}

// ended waits for ch to be closed: the store has closed the connection.
func ended(t *testing.T, ch <-chan *packets.ControlPacket) []*packets.ControlPacket {
	t.Helper()
	var got []*packets.ControlPacket
	timeout := time.After(waitTimeout)
	for {
		select {
		case p, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, p)
		case <-timeout:
			t.Fatalf("connection still open after %v", waitTimeout)
		}
	}
}

// heldClient connects a raw client with the given keep-alive, subscribed to
// its response topic, and returns its packets.
func heldClient(t *testing.T, srv *localstore.Server, id string, keepAlive uint16) (*rawConn, <-chan *packets.ControlPacket) {
	t.Helper()
	rc := dialRaw(t, srv.Addr(), 0)
	rc.connect(id, keepAlive)
	rc.subscribe(id + "/response")
	return rc, stream(rc)
}

// Hold ToStore: a request sent while held is not read, so not executed,
// until Release; then it is executed and answered.
func TestHoldToStore(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	rc, ch := heldClient(t, srv, "held-reads", 30)
	other := connect(t, srv)

	if err := srv.Hold("held-reads", localstore.ToStore); err != nil {
		t.Fatal(err)
	}
	rc.write(rc.request(1, "held-reads/response", "SET", "k", "v"))
	nothing(t, ch)
	if n := srv.Requests("held-reads"); n != 0 {
		t.Fatalf("Requests = %d while held; want 0", n)
	}
	mustPayload(t, other.do(cmd("GET", "k")), nullResp)
	if !srv.Connected("held-reads") {
		t.Fatal("held client disconnected")
	}

	srv.Release("held-reads")
	_, got := answers(t, ch, 1)
	if got[1] != okResp {
		t.Fatalf("response %q", got[1])
	}
	mustPayload(t, other.do(cmd("GET", "k")), "$1\r\nv\r\n")
	srv.Release("held-reads") // nothing held: a no-op
	rc.write(rc.request(2, "held-reads/response", "GET", "k"))
	if _, got := answers(t, ch, 1); got[2] != "$1\r\nv\r\n" {
		t.Fatalf("GET after Release: %q", got[2])
	}
}

// Hold FromStore: requests are executed (another client sees their effect),
// those sent after the first held answer too, but their answers come only
// after Release, in order.
func TestHoldFromStore(t *testing.T) {
	srv := startStore(t, localstore.Config{WriteTimeout: time.Minute})
	rc, ch := heldClient(t, srv, "held-writes", 30)
	other := connect(t, srv)

	if err := srv.Hold("held-writes", localstore.FromStore); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"v1", "v2", "v3"} {
		rc.write(rc.request(uint16(i+1), "held-writes/response", "SET", "k", v))
		waitValue(t, other, "k", v)
	}
	nothing(t, ch)

	srv.Release("held-writes")
	order, got := answers(t, ch, 3)
	if !slices.Equal(order, []uint16{1, 2, 3}) {
		t.Fatalf("answers in order %v", order)
	}
	for id, p := range got {
		if p != okResp {
			t.Fatalf("response %d: %q", id, p)
		}
	}
}

// A hold ends the connection as a frozen network path would: reads held
// past the keep-alive deadline, or writes past Config.WriteTimeout.
func TestHoldPastDeadline(t *testing.T) {
	t.Run("keep-alive", func(t *testing.T) {
		srv := startStore(t, localstore.Config{})
		_, ch := heldClient(t, srv, "silent", 1) // read deadline: 1 s after the last packet read
		if err := srv.Hold("silent", localstore.ToStore); err != nil {
			t.Fatal(err)
		}
		ended(t, ch)
		waitDisconnected(t, srv, "silent")
	})
	t.Run("write timeout", func(t *testing.T) {
		srv := startStore(t, localstore.Config{WriteTimeout: 200 * time.Millisecond})
		rc, ch := heldClient(t, srv, "deaf", 30)
		if err := srv.Hold("deaf", localstore.FromStore); err != nil {
			t.Fatal(err)
		}
		rc.write(&packets.Pingreq{})
		for _, p := range ended(t, ch) {
			t.Errorf("got %v through a hold", p)
		}
		waitDisconnected(t, srv, "deaf")
	})
}

// waitValue waits until c reads value at key: a request sent by another
// client has been executed.
func waitValue(t *testing.T, c *rawClient, key, value string) {
	t.Helper()
	want := fmt.Sprintf("$%d\r\n%s\r\n", len(value), value)
	deadline := time.Now().Add(waitTimeout)
	for c.do(cmd("GET", key)).payload != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s is not %q after %v", key, value, waitTimeout)
		}
		time.Sleep(10 * time.Millisecond) // polling the store's state: there is no event to wait on
	}
}

func waitDisconnected(t *testing.T, srv *localstore.Server, id string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for srv.Connected(id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still connected after %v", id, waitTimeout)
		}
		time.Sleep(10 * time.Millisecond) // polling the store's state: there is no event to wait on
	}
}

// Nothing waits for a hold: Close, Kick and Drop end held connections at
// once (the timeouts are a minute), and a new connection of a held client
// id takes over at once and is not held.
func TestHoldDoesNotBlock(t *testing.T) {
	cfg := localstore.Config{WriteTimeout: time.Minute, CloseTimeout: time.Minute}
	within := func(t *testing.T, what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		start := time.Now()
		go func() { defer close(done); f() }()
		select {
		case <-done:
			t.Logf("%s: %v", what, time.Since(start))
		case <-time.After(waitTimeout):
			t.Fatalf("%s did not return within %v", what, waitTimeout)
		}
	}
	// held holds both directions, one after the other, of a client with no
	// keep-alive (only the store can end it) whose response is held.
	held := func(t *testing.T, srv *localstore.Server, id string) <-chan *packets.ControlPacket {
		rc, ch := heldClient(t, srv, id, 0)
		if err := srv.Hold(id, localstore.FromStore); err != nil {
			t.Fatal(err)
		}
		rc.write(rc.request(1, id+"/response", "GET", "k"))
		deadline := time.Now().Add(waitTimeout)
		for srv.Requests(id) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("request not read within %v", waitTimeout)
			}
			time.Sleep(10 * time.Millisecond) // polling the store's state: there is no event to wait on
		}
		if err := srv.Hold(id, localstore.ToStore); err != nil {
			t.Fatal(err)
		}
		return ch
	}

	t.Run("Close", func(t *testing.T) {
		srv, err := localstore.Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		both := held(t, srv, "both")
		rc, reads := heldClient(t, srv, "reads", 0)
		if err := srv.Hold("reads", localstore.ToStore); err != nil {
			t.Fatal(err)
		}
		rc.write(rc.request(1, "reads/response", "GET", "k"))
		within(t, "Close", func() { _ = srv.Close() })
		ended(t, both)
		// Only reads were held: the DISCONNECT gets through.
		got := ended(t, reads)
		if len(got) != 1 {
			t.Fatalf("got %v; want a DISCONNECT", got)
		}
		if d, ok := got[0].Content.(*packets.Disconnect); !ok || d.ReasonCode != 0x8b {
			t.Fatalf("got %v; want DISCONNECT 0x8b", got[0])
		}
	})
	t.Run("Kick", func(t *testing.T) {
		srv := startStore(t, cfg)
		ch := held(t, srv, "kicked")
		within(t, "Kick", func() {
			if err := srv.Kick("kicked"); err != nil {
				t.Error(err)
			}
		})
		ended(t, ch)
	})
	t.Run("Drop", func(t *testing.T) {
		srv := startStore(t, cfg)
		ch := held(t, srv, "dropped")
		within(t, "Drop", func() {
			if err := srv.Drop("dropped"); err != nil {
				t.Error(err)
			}
		})
		ended(t, ch)
	})
	t.Run("takeover", func(t *testing.T) {
		srv := startStore(t, cfg)
		ch := held(t, srv, "twice")
		var c *rawClient
		within(t, "reconnect", func() { c = connect(t, srv, connOpts{id: "twice"}) })
		ended(t, ch)
		mustPayload(t, c.do(cmd("SET", "k", "v")), okResp)
	})
}

func TestHoldErrors(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	if err := srv.Hold("nobody", localstore.Both); !errors.Is(err, localstore.ErrNoClient) {
		t.Fatalf("Hold of an unknown client: %v; want ErrNoClient", err)
	}
	srv.Release("nobody")
	c := connect(t, srv)
	for _, d := range []localstore.Direction{0, 4, -1} {
		if err := srv.Hold(c.id, d); err == nil || errors.Is(err, localstore.ErrNoClient) {
			t.Errorf("Hold(%v): %v; want an invalid direction error", d, err)
		}
	}
	mustPayload(t, c.do(cmd("SET", "k", "v")), okResp) // nothing was held
}

// Drop: the request is executed, the client never hears of it and its
// request times out; notifications still arrive; once the fault is cleared
// the next request is answered.
func TestResponseFaultDrop(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "unanswered"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	other := connect(t, srv)

	srv.SetResponseFault("unanswered", localstore.ResponseFault{Drop: true})
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.Set(short, "k", []byte("v"), sskv.SetOptions{})
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Set with its response dropped: %v; want a timeout", err)
	}
	waitValue(t, other, "k", "v")

	srv.SetResponseFault("unanswered", localstore.ResponseFault{})
	res, err := c.Get(ctx, "k")
	if err != nil || string(res.Value) != "v" {
		t.Fatalf("Get after the fault is cleared: %q, %v", res.Value, err)
	}
}

// Drop does not touch notifications: a watch registered while responses
// are dropped is registered and notifies.
func TestResponseFaultNotifications(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := connect(t, srv)
	other := connect(t, srv)
	srv.SetResponseFault(c.id, localstore.ResponseFault{Drop: true})
	ch, _ := c.send(cmd("KEYNOTIFY", "w")) // returns on PUBACK, sent once executed
	if !srv.Watching(c.id, "w") {
		t.Fatal("KEYNOTIFY not executed")
	}
	mustPayload(t, other.do(cmd("SET", "w", "x")), okResp)
	if p := c.next(); string(p.Payload) != "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\nx\r\n" {
		t.Fatalf("notification %q", p.Payload)
	}
	select {
	case p := <-ch:
		t.Fatalf("dropped response arrived: %q", p.Payload)
	case <-time.After(quiet):
	}
}

// Delay: each response arrives no sooner than Delay after its request, in
// order; lowering the delay does not let a response overtake an earlier one.
func TestResponseFaultDelay(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	rc, ch := heldClient(t, srv, "slow-answers", 30)
	const delay = 300 * time.Millisecond
	srv.SetResponseFault("slow-answers", localstore.ResponseFault{Delay: delay})

	const n = 5
	sent := map[uint16]time.Time{}
	for id := uint16(1); id <= n; id++ {
		sent[id] = time.Now()
		rc.write(rc.request(id, "slow-answers/response", "SET", "k", string(rune('a'+id))))
	}
	got := map[uint16]time.Time{}
	var order []uint16
	for acks := 0; acks < n || len(order) < n; {
		switch p := nextPacket(t, ch).Content.(type) {
		case *packets.Puback:
			acks++
		case *packets.Publish:
			id := binary.BigEndian.Uint16(p.Properties.CorrelationData)
			got[id] = time.Now()
			order = append(order, id)
		}
	}
	for i, id := range order {
		if id != uint16(i+1) {
			t.Fatalf("responses in order %v", order)
		}
		if d := got[id].Sub(sent[id]); d < delay {
			t.Errorf("response %d after %v; want at least %v", id, d, delay)
		}
	}

	// A response delayed by a second, then one with the fault cleared: the
	// second waits for the first.
	srv.SetResponseFault("slow-answers", localstore.ResponseFault{Delay: time.Second})
	rc.write(rc.request(n+1, "slow-answers/response", "GET", "k"))
	if p := nextPacket(t, ch); p.Type != packets.PUBACK { // executed, response queued
		t.Fatalf("got %v; want PUBACK", p)
	}
	srv.SetResponseFault("slow-answers", localstore.ResponseFault{})
	rc.write(rc.request(n+2, "slow-answers/response", "GET", "k"))
	order, payloads := answers(t, ch, 1) // the PUBACK of n+2, and the first response
	if order[0] != n+1 {
		t.Fatalf("response %d before %d", order[0], n+1)
	}
	if payloads[n+1] != "$1\r\nf\r\n" {
		t.Fatalf("GET: %q", payloads[n+1])
	}
	if p := nextPacket(t, ch); p.Type != packets.PUBLISH || binary.BigEndian.Uint16(p.Content.(*packets.Publish).Properties.CorrelationData) != n+2 {
		t.Fatalf("got %v; want the response to %d", p, n+2)
	}
}

// Close does not wait for delayed responses: they are discarded.
func TestResponseFaultDelayClose(t *testing.T) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := connect(t, srv, connOpts{noCleanup: true})
	srv.SetResponseFault(c.id, localstore.ResponseFault{Delay: time.Hour})
	c.send(cmd("SET", "k", "v")) // returns on PUBACK: the response is queued
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Close() }()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Close waited for a delayed response")
	}
	<-c.c.Done()
}
