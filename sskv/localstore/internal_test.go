package localstore

import (
	"context"
	"errors"
	"net"
	"reflect"
	"testing"
	"time"

	mqttpackets "github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
)

// TestLazyExpiryOrder: a request on a key whose PX deadline has passed before
// the expiry timer fired expires it first, so the DELETE notification comes
// before, and is stamped before, the request's own change. A client that
// orders notifications by version (as sskv does) would otherwise drop the
// SET and believe the key deleted.
func TestLazyExpiryOrder(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	type note struct {
		payload string
		ts      hlc.Timestamp
	}
	var notes []note
	srv.observe = func(_, _ string, payload []byte, ts string) { // called with srv.mu held
		v, err := hlc.Parse(ts)
		if err != nil {
			t.Errorf("notification __ts %q: %v", ts, err)
		}
		notes = append(notes, note{string(payload), v})
	}
	clock, _ := hlc.NewClock("c")
	do := func(args ...string) result {
		b := make([][]byte, len(args))
		for i, a := range args {
			b[i] = []byte(a)
		}
		res, _ := srv.serve(clientRef{id: "watcher"}, "", resp.AppendCommand(nil, b...),
			[]packets.UserProperty{{Key: "__ts", Val: clock.Now().String()}}, time.Time{}, repeatable{})
		return res
	}
	do("KEYNOTIFY", "lease")
	do("SET", "lease", "me", "PX", "3600000")

	// The deadline passes, but the timer (set for an hour) has not fired.
	srv.mu.Lock()
	srv.tab.setDeadline(srv.tab.find([]byte("lease")), srv.tab.now()-int64(time.Millisecond))
	notes = nil
	srv.mu.Unlock()

	renew := do("SET", "lease", "me", "NEX", "PX", "3600000")
	if string(renew.payload) != "+OK\r\n" {
		t.Fatalf("renewal answered %q", renew.payload)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(notes) != 2 || notes[0].payload != "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" || notes[1].payload[:9] != "*4\r\n$6\r\nN" {
		t.Fatalf("notifications %+v, want DELETE then SET", notes)
	}
	if !notes[0].ts.Before(notes[1].ts) || notes[1].ts != renew.version {
		t.Fatalf("DELETE at %v, SET at %v (response %v): want DELETE < SET = response", notes[0].ts, notes[1].ts, renew.version)
	}
}

// TestFlowControlOff: every session runs with the broker's outbound flow
// control off (send quota and maximum zero), so mochi's Inflight.NextImmediate,
// which deadlocks against a concurrent delivery, can never run; see
// noFlowControl. The client states a Receive Maximum, as the official SDKs do
// (without one, mochi leaves flow control off by itself), and connects twice:
// taking over a session resets the quota.
func TestFlowControlOff(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		conn, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c := paho.NewClient(paho.ClientConfig{Conn: mqttpackets.NewThreadSafeConn(conn)})
		rm, expiry := uint16(65535), uint32(60)
		if _, err := c.Connect(ctx, &paho.Connect{ClientID: "flow", KeepAlive: 30, CleanStart: i == 0,
			Properties: &paho.ConnectProperties{ReceiveMaximum: &rm, SessionExpiryInterval: &expiry}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Disconnect(&paho.Disconnect{}); <-c.Done() }()
		if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "x", QoS: 1}}}); err != nil {
			t.Fatal(err) // the session is established and being read
		}
		cl := srv.current("flow")
		in := reflect.ValueOf(cl.State.Inflight).Elem()
		if q, m := in.FieldByName("sendQuota").Int(), in.FieldByName("maximumSendQuota").Int(); q != 0 || m != 0 {
			t.Fatalf("connection %d: send quota %d, maximum %d; want 0, 0", i+1, q, m)
		}
	}
}

// recoverIn runs f and reports whether it panicked in a function whose name
// begins with prefix, as establish decides.
func recoverIn(prefix string, f func()) (in bool) {
	defer func() {
		if recover() != nil {
			in = panicIn(prefix)
		}
	}()
	f()
	return false
}

// TestPanicIn: establish recovers from panics of the broker's decoder, and
// only from those.
func TestPanicIn(t *testing.T) {
	truncated := func() {
		pk := packets.Packet{ProtocolVersion: 5}
		_ = pk.SubscribeDecode([]byte{0, 1, 0, 0, 1, 'k'}) // mochi-mqtt/server#501
	}
	if !recoverIn(decoderPackage, truncated) {
		t.Error("a panic in the decoder was not found to be the decoder's")
	}
	elsewhere := func() {
		var s []int
		_ = s[len(s)+1]
	}
	if recoverIn(decoderPackage, elsewhere) {
		t.Error("a panic in this package was found to be the decoder's")
	}
	if recoverIn(decoderPackage, func() { panic("explicit") }) {
		t.Error("an explicit panic in this package was found to be the decoder's")
	}
}

// TestEstablishRecovers: establish recovers a panic of the broker's decoder
// on the connection's goroutine, the CONNECT handshake's included, and lets
// any other panic go on.
func TestEstablishRecovers(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	l := &listener{s: srv, id: "t"}
	establish := func(f func()) (repanicked any, err error) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		defer func() { repanicked = recover() }()
		return nil, l.establish(func(string, net.Conn) error { f(); return nil }, newDeadlineConn(a, srv))
	}

	decoder := func() {
		pk := packets.Packet{ProtocolVersion: 5}
		_ = pk.SubscribeDecode([]byte{0, 1, 0, 0, 1, 'k'}) // mochi-mqtt/server#501
	}
	if p, err := establish(decoder); p != nil || !errors.Is(err, errDecoderPanicked) {
		t.Errorf("decoder panic: establish returned %v and panicked with %v; want errDecoderPanicked", err, p)
	}
	if p, err := establish(func() { panic("elsewhere") }); p != "elsewhere" {
		t.Errorf("another panic: establish returned %v and panicked with %#v; want it to panic again with the same value", err, p)
	}
}
