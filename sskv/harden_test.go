package sskv_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// dialFast dials with a context of d and reports the error and how long
// Dial took.
func dialFast(t *testing.T, d time.Duration, cfg sskv.Config) (time.Duration, error) {
	t.Helper()
	if cfg.ClientID == "" {
		cfg.ClientID = testID(t)
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin, cfg.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	c, err := sskv.Dial(ctx, cfg)
	took := time.Since(start)
	if err == nil {
		_ = c.Close()
		t.Fatal("Dial succeeded")
	}
	if took > d+time.Second {
		t.Errorf("Dial took %v with a %v context", took, d)
	}
	return took, err
}

// TestOversizedConnack: a server whose CONNACK header declares 268 MB
// neither makes the client allocate it nor holds Dial: it fails at once
// with ErrPacketTooLarge. The client announces its limit in CONNECT.
func TestOversizedConnack(t *testing.T) {
	announced := make(chan uint32, 16)
	b := startFakeBroker(t, func(c net.Conn) {
		cp, err := readConnect(c)
		if err != nil {
			return
		}
		if cp.Properties.MaximumPacketSize != nil {
			announced <- *cp.Properties.MaximumPacketSize
		}
		_, _ = c.Write([]byte{0x20, 0xff, 0xff, 0xff, 0x7f}) // CONNACK, 268435455 bytes to come
		drain(c)
	})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	took, err := dialFast(t, 5*time.Second, sskv.Config{Addr: b.Addr(), MaxPacketSize: 1 << 20})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, sskv.ErrPacketTooLarge) {
		t.Fatalf("Dial: %v, want ErrPacketTooLarge", err)
	}
	if took > 2*time.Second {
		t.Errorf("Dial took %v", took)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Errorf("Dial allocated %d MB", alloc>>20)
	}
	if got := <-announced; got != 1<<20 {
		t.Errorf("CONNECT announced Maximum Packet Size %d, want %d", got, 1<<20)
	}
	t.Logf("Dial failed in %v: %v", took, err)
}

// TestOversizedPacketDropsConnection: after the connection is up, a packet
// that declares more than MaxPacketSize ends the connection before it is
// read; the client reconnects.
func TestOversizedPacketDropsConnection(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	big := make([]byte, 64<<10)
	writer := dial(t, srv)
	if _, err := writer.Set(testCtx(t), "big", big, sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) { cfg.MaxPacketSize = 16 << 10 })
	ctx, cancel := context.WithTimeout(testCtx(t), time.Second)
	defer cancel()
	// The broker either drops the response (it knows the client's limit)
	// or sends it and the client drops the connection: either way the
	// request does not succeed, and the client stays usable.
	if g, err := c.Get(ctx, "big"); err == nil {
		t.Fatalf("Get of a value above MaxPacketSize: %d bytes, no error", len(g.Value))
	}
	if _, err := c.Get(testCtx(t), "missing"); err != nil {
		t.Fatal(err)
	}
}

// TestReceiveMaximum: the client never has more QoS 1 requests
// unacknowledged than the server's Receive Maximum.
func TestReceiveMaximum(t *testing.T) {
	const recvMax = 5
	var mu sync.Mutex
	inflight, most := 0, 0
	b := startFakeBroker(t, func(c net.Conn) {
		if _, err := readConnect(c); err != nil {
			return
		}
		rm := uint16(recvMax)
		ca := packets.NewControlPacket(packets.CONNACK)
		ca.Content.(*packets.Connack).Properties.ReceiveMaximum = &rm
		if _, err := ca.WriteTo(c); err != nil {
			return
		}
		for {
			p, err := packets.ReadPacket(c)
			if err != nil {
				return
			}
			var reply *packets.ControlPacket
			switch x := p.Content.(type) {
			case *packets.Subscribe:
				reply = packets.NewControlPacket(packets.SUBACK)
				sa := reply.Content.(*packets.Suback)
				sa.PacketID = x.PacketID
				sa.Reasons = make([]byte, len(x.Subscriptions))
				for i := range sa.Reasons {
					sa.Reasons[i] = 1
				}
			case *packets.Publish: // never acknowledged
				mu.Lock()
				inflight++
				most = max(most, inflight)
				mu.Unlock()
			case *packets.Pingreq:
				reply = packets.NewControlPacket(packets.PINGRESP)
			}
			if reply != nil {
				if _, err := reply.WriteTo(c); err != nil {
					return
				}
			}
		}
	})
	c, err := sskv.Dial(testCtx(t), sskv.Config{Addr: b.Addr(), ClientID: testID(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			_, _ = c.Get(ctx, string(rune('a'+i)))
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if most > recvMax {
		t.Fatalf("%d PUBLISHes unacknowledged at once, over the server's Receive Maximum %d", most, recvMax)
	}
	// The client itself keeps to half of it (see Conn.acquireSlot); a
	// request abandoned by its context frees its slot before its PUBACK.
	if most < recvMax/2 {
		t.Fatalf("only %d PUBLISHes in flight: the test did not reach the client's limit", most)
	}
}

// TestDialFailsFast: failures that retrying cannot cure end Dial at once,
// with the cause, instead of waiting for its context.
func TestDialFailsFast(t *testing.T) {
	cert, pool, _ := selfSigned(t)
	plain := startStore(t, localstore.Config{})
	tlsStore := startStore(t, localstore.Config{Addr: "-", TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	httpServer := startFakeBroker(t, func(c net.Conn) {
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		drain(c)
	})
	garbage := startFakeBroker(t, func(c net.Conn) {
		if _, err := readConnect(c); err != nil {
			return
		}
		_, _ = c.Write([]byte{0x20, 0x04, 0x00, 0x00, 0x05, 0xff}) // CONNACK with a truncated property
		drain(c)
	})
	mqttAnswer := startFakeBroker(t, func(c net.Conn) {
		_, _ = packets.NewControlPacket(packets.CONNACK).WriteTo(c) // plain MQTT to a TLS client
		drain(c)
	})
	for _, tc := range []struct {
		name  string
		cfg   sskv.Config
		check func(error) bool
	}{
		{"not MQTT", sskv.Config{Addr: httpServer.Addr()}, func(err error) bool { return errors.Is(err, sskv.ErrNotMQTT) }},
		{"malformed CONNACK", sskv.Config{Addr: garbage.Addr()}, func(err error) bool { return errors.Is(err, sskv.ErrNotMQTT) }},
		{"TLS to plain MQTT", sskv.Config{Addr: mqttAnswer.Addr(), TLS: &tls.Config{RootCAs: pool}}, func(err error) bool {
			var rh tls.RecordHeaderError
			return errors.As(err, &rh)
		}},
		{"plain to TLS", sskv.Config{Addr: tlsStore.TLSAddr(), FailFast: true}, func(err error) bool { return err != nil }},
		{"unknown host", sskv.Config{Addr: "no-such-host.invalid:1883"}, func(err error) bool {
			var dnsErr *net.DNSError
			return errors.As(err, &dnsErr) && dnsErr.IsNotFound
		}},
		{"refused, FailFast", sskv.Config{Addr: closedPort(t), FailFast: true}, func(err error) bool {
			return strings.Contains(err.Error(), "connection refused")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			took, err := dialFast(t, 5*time.Second, tc.cfg)
			t.Logf("%v after %v", err, took)
			if !tc.check(err) {
				t.Errorf("Dial: %v", err)
			}
			if took > 2*time.Second {
				t.Errorf("Dial took %v to fail", took)
			}
			if strings.Count(err.Error(), "sskv:") != 1 {
				t.Errorf("error %q: want one sskv: prefix", err)
			}
		})
	}
	_ = plain
}

func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// TestDialErrorSaysWhy: when Dial's context ends first, its error carries
// the last cause: the last failed attempt, or the attempt still waiting.
func TestDialErrorSaysWhy(t *testing.T) {
	_, err := dialFast(t, 500*time.Millisecond, sskv.Config{Addr: closedPort(t)})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("refused: %v", err)
	}
	silent := startFakeBroker(t, drain)
	_, err = dialFast(t, 500*time.Millisecond, sskv.Config{Addr: silent.Addr()})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no CONNACK") {
		t.Errorf("silent server: %v", err)
	}
}

// TestLostConnectionInError: a request in flight when the connection is
// lost, whose context then ends, says that the connection was lost.
func TestLostConnectionInError(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{})
	c := dial(t, srv, viaProxy(p))
	p.Blackhole() // the SET reaches no one...
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{})
		res <- err
	}()
	eventually(t, "the request to be sent", func() bool { return sskv.PendingForTest(c) == 1 })
	_ = p.Close() // ...and the store is gone
	err := <-res
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection was lost") {
		t.Fatalf("SET when the store died: %v", err)
	}
	t.Log(err)
}

// TestErrorsSayItOnce: errors name the operation and the key once, with one
// sskv: prefix, and errors.Is still finds the cause.
func TestErrorsSayItOnce(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	c := dial(t, srv)
	ctx := testCtx(t)
	_, err := c.Watch(ctx, "")
	if !errors.Is(err, sskv.ErrKeyLengthZero) || err.Error() != `sskv: watch "": state store error: the key length is zero` {
		t.Errorf("Watch of an empty key: %q", err)
	}
	token := hlc.Timestamp{Wall: 1, Node: "n"}
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{FencingToken: token}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Set(ctx, "k", []byte("w"), sskv.SetOptions{})
	var se *sskv.ServiceError
	if !errors.As(err, &se) || !errors.Is(err, sskv.ErrFencingTokenRequired) ||
		err.Error() != `sskv: SET "k": state store error: `+se.Message {
		t.Errorf("SET without a token: %q", err)
	}
	_, err = c.Del(ctx, "k", sskv.DelOptions{FencingToken: token})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	_, err = c.Get(ctx, "k")
	if !errors.Is(err, sskv.ErrClosed) || err.Error() != `sskv: GET "k": client closed` {
		t.Errorf("Get after Close: %q", err)
	}
}

// FuzzDialAnswer: a server answers the client's CONNECT with arbitrary
// bytes (packets with arbitrary declared lengths and properties). Dial
// returns by its context's deadline, with an error or a client, and never
// panics; MaxPacketSize keeps what it allocates bounded.
func FuzzDialAnswer(f *testing.F) {
	connack := func(props ...byte) []byte {
		b := append([]byte{0x20, byte(3 + len(props)), 0x00, 0x00, byte(len(props))}, props...)
		return b
	}
	f.Add(connack())
	f.Add(connack(0x21, 0x00, 0x05))                             // Receive Maximum 5
	f.Add(connack(0x27, 0x00, 0x00, 0x00, 0x10))                 // Maximum Packet Size 16
	f.Add(connack(0x13, 0x00, 0x00))                             // Server Keep Alive 0
	f.Add(connack(0x15, 0x00, 0x03, 'K', '8', 'S'))              // Authentication Method
	f.Add([]byte{0x20, 0xff, 0xff, 0xff, 0x7f})                  // 268 MB declared
	f.Add([]byte{0x20, 0x80, 0x80, 0x80, 0x80, 0x01})            // 5-byte Remaining Length
	f.Add([]byte{0xf0, 0x02, 0x18, 0x00})                        // AUTH, continue
	f.Add([]byte{0x20, 0x02, 0x00, 0x86})                        // refused: bad user name or password
	f.Add(append(connack(), 0x90, 0x04, 0x00, 0x01, 0x00, 0x01)) // CONNACK, then a SUBACK
	f.Add([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
	f.Add([]byte{})

	var answer sync.Mutex
	var current []byte
	b := startFakeBroker(f, func(c net.Conn) {
		if _, err := readConnect(c); err != nil {
			return
		}
		answer.Lock()
		data := current
		answer.Unlock()
		_, _ = c.Write(data)
		drain(c)
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		answer.Lock()
		current = data
		answer.Unlock()
		const d = 100 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		c, err := sskv.Dial(ctx, sskv.Config{Addr: b.Addr(), ClientID: "fuzz", MaxPacketSize: 64 << 10,
			ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond,
			HandshakeTimeout: 30 * time.Millisecond}) // its deadline, set and cleared, under any answer
		if took := time.Since(start); took > d+time.Second {
			t.Fatalf("Dial took %v with a %v context (err %v)", took, d, err)
		}
		if err == nil {
			_ = c.Close()
		}
	})
}
