package sskv_test

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A request larger than the broker's Maximum Packet Size fails at once,
// and nothing else notices: no reconnect, no resync, other requests go on.
// (It used to be sent: the store closed the connection, and the resumed
// session sent it again on every reconnect.)
func TestTooLargeRefusedAtOnce(t *testing.T) {
	srv := startStore(t, localstore.Config{}) // 4 MiB packets
	c := dial(t, srv)
	ctx := testCtx(t)
	w, err := c.Watch(ctx, "watched")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	wantInitial(t, w, sskv.OpDelete, "")
	before, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	_, err = c.Set(ctx, "big", make([]byte, 5<<20), sskv.SetOptions{})
	took := time.Since(start)
	var se *sskv.SizeError
	if !errors.Is(err, sskv.ErrTooLarge) || !errors.As(err, &se) || se.Limit != localstore.DefaultMaxPacketSize || se.Size <= se.Limit {
		t.Fatalf("5 MiB Set = %v; want ErrTooLarge with the sizes", err)
	}
	if took > waitTimeout/4 {
		t.Errorf("the refusal took %v", took)
	}
	t.Logf("refused in %v: %v", took, err)

	// The same client carries on, on the same connection, and its watch
	// saw nothing but the next change.
	if _, err := c.Set(ctx, "watched", []byte("after"), sskv.SetOptions{}); err != nil {
		t.Fatalf("Set after the refusal: %v", err)
	}
	select {
	case ev := <-w.Events():
		if ev.Resync || string(ev.Value) != "after" {
			t.Fatalf("watch event %+v; want the Set of \"after\", no Resync", ev)
		}
	case <-ctx.Done():
		t.Fatal("no event after the refusal")
	}
	after, err := c.Connection(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("connection %d after the refusal, was %d: the client reconnected", after.Number(), before.Number())
	}
	if res, err := c.Get(ctx, "big"); err != nil || res.Found {
		t.Fatalf("Get big = %+v, %v; want not found", res, err)
	}
	// Bound requests are refused the same way.
	if _, err := after.Set(ctx, "big", make([]byte, 5<<20), sskv.SetOptions{}); !errors.Is(err, sskv.ErrTooLarge) {
		t.Fatalf("Conn.Set of 5 MiB = %v; want ErrTooLarge", err)
	}
}

// The limit is the broker's, to the byte: a request whose packet is exactly
// the Maximum Packet Size goes out and is applied; one byte more does not.
func TestTooLargeBoundary(t *testing.T) {
	const limit = 64 << 10
	srv := startStore(t, localstore.Config{MaxPacketSize: limit})
	c := dial(t, srv)
	ctx := testCtx(t)
	_, err := c.Set(ctx, "k", make([]byte, limit), sskv.SetOptions{})
	var se *sskv.SizeError
	if !errors.As(err, &se) || se.Limit != limit {
		t.Fatalf("Set of %d bytes = %v; want a SizeError with limit %d", limit, err, limit)
	}
	fits := limit - int(se.Size-limit) // the value that makes the packet exactly limit bytes
	res, err := c.Set(ctx, "k", bytes.Repeat([]byte{'x'}, fits), sskv.SetOptions{})
	if err != nil || !res.Applied {
		t.Fatalf("Set of a packet of exactly %d bytes = %+v, %v; want applied", limit, res, err)
	}
	if _, err := c.Set(ctx, "k", make([]byte, fits+1), sskv.SetOptions{}); !errors.As(err, &se) || se.Size != limit+1 {
		t.Fatalf("Set one byte over = %v; want a SizeError of %d bytes", err, limit+1)
	}
	if got, err := c.Get(ctx, "k"); err != nil || len(got.Value) != fits {
		t.Fatalf("Get = %d bytes, %v; want %d", len(got.Value), err, fits)
	}
}

// A broker that ends the connection, blaming the packet, whenever it gets a
// certain request does not keep the client reconnecting forever: the
// resumed session sends the request on at most three connections, then
// fails it and sends it no more.
func TestSessionGivesUpOnARefusedRequest(t *testing.T) {
	var (
		mu       sync.Mutex
		refusals int
		acked    = make(chan struct{}, 16)
	)
	b := startFakeBroker(t, func(c net.Conn) {
		if _, err := readConnect(c); err != nil {
			return
		}
		ca := packets.NewControlPacket(packets.CONNACK)
		mu.Lock()
		ca.Content.(*packets.Connack).SessionPresent = refusals > 0
		mu.Unlock()
		if _, err := ca.WriteTo(c); err != nil {
			return
		}
		for {
			p, err := packets.ReadPacket(c)
			if err != nil {
				return
			}
			switch x := p.Content.(type) {
			case *packets.Subscribe:
				sa := packets.NewControlPacket(packets.SUBACK)
				sa.Content.(*packets.Suback).PacketID = x.PacketID
				sa.Content.(*packets.Suback).Reasons = make([]byte, len(x.Subscriptions))
				if _, err := sa.WriteTo(c); err != nil {
					return
				}
			case *packets.Publish:
				if len(x.Payload) > 1000 { // the request it cannot take
					mu.Lock()
					refusals++
					mu.Unlock()
					d := packets.NewControlPacket(packets.DISCONNECT)
					d.Content.(*packets.Disconnect).ReasonCode = packets.DisconnectMalformedPacket
					_, _ = d.WriteTo(c)
					return // closes the connection
				}
				pa := packets.NewControlPacket(packets.PUBACK)
				pa.Content.(*packets.Puback).PacketID = x.PacketID
				if _, err := pa.WriteTo(c); err != nil {
					return
				}
				acked <- struct{}{}
			}
		}
	})
	c, err := sskv.Dial(testCtx(t), sskv.Config{Addr: b.Addr(), ClientID: testID(t),
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Set(testCtx(t), "k", make([]byte, 2000), sskv.SetOptions{})
	if !errors.Is(err, sskv.ErrConnectionLost) {
		t.Fatalf("Set = %v; want ErrConnectionLost once the session gave up on it", err)
	}
	// The session's next resend is the disarmed request, which the broker
	// acknowledges; after it, nothing more is refused.
	select {
	case <-acked:
	case <-testCtx(t).Done():
		t.Fatal("the disarmed request was never acknowledged")
	}
	if _, err := c.Connection(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := refusals
	mu.Unlock()
	// Three refusals end it when each is counted in time. A resend that
	// goes out on the next connection before the client has recorded why
	// the last one ended (the DISCONNECT's reason) is not counted, so a
	// loaded machine sees 4 or 5. What matters is that it ends, not in a
	// loop; counting every resend exactly is left to do.
	if n < 3 || n > 2*3 {
		t.Fatalf("the broker refused the request %d times; want 3 (at most 6)", n)
	}
	if got := b.accepted(); got != n+1 {
		t.Fatalf("%d connections; want %d (%d refused, then one that stays)", got, n+1, n)
	}
}
