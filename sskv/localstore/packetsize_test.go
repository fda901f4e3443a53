package localstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// smallPacket is the Maximum Packet Size of the clients of these tests:
// sskv's smallest.
const smallPacket = 1024

// connectMax sends CONNECT announcing a Maximum Packet Size of max, and a
// Topic Alias Maximum of aliases, and expects a successful CONNACK.
func (rc *rawConn) connectMax(id string, max uint32, aliases uint16) {
	rc.t.Helper()
	rc.id = id
	rc.clock, _ = hlc.NewClock(id)
	rc.write(&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true,
		KeepAlive: 30, Properties: &packets.Properties{MaximumPacketSize: &max, TopicAliasMaximum: &aliases}})
	if ca, ok := rc.read().Content.(*packets.Connack); !ok || ca.ReasonCode != 0 {
		rc.t.Fatalf("%s: CONNACK expected, got %v", id, ca)
	}
}

// nextPublish reads until a PUBLISH on topic comes, and fails the test if
// the connection ends first.
func (rc *rawConn) nextPublish(topic string) *packets.Publish {
	rc.t.Helper()
	for {
		switch p := rc.read().Content.(type) {
		case *packets.Publish:
			if p.Topic == topic {
				return p
			}
		case *packets.Disconnect:
			rc.t.Fatalf("%s: DISCONNECT 0x%02x while waiting for a message on %q", rc.id, p.ReasonCode, topic)
		}
	}
}

// wireSize returns the size of p on the wire, fixed header included.
func wireSize(t *testing.T, p *packets.Publish) int {
	t.Helper()
	var buf bytes.Buffer
	if _, err := p.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Len()
}

// largestFitting returns the largest value length n for which the packet
// that like carries for a value of n bytes (payload(n) in place of like's
// payload) is at most max bytes, and that packet's size.
func largestFitting(t *testing.T, like *packets.Publish, max int, payload func(n int) []byte) (int, int) {
	t.Helper()
	p := *like
	for n := max; n > 0; n-- {
		p.Payload = payload(n)
		if size := wireSize(t, &p); size <= max {
			return n, size
		}
	}
	t.Fatalf("no value fits in %d bytes", max)
	return 0, 0
}

func notifySetPayload(n int) []byte {
	return resp.AppendCommand(nil, []byte("NOTIFY"), []byte("SET"), []byte("VALUE"), bytes.Repeat([]byte("v"), n))
}

func getPayload(n int) []byte { return resp.AppendBulk(nil, bytes.Repeat([]byte("v"), n)) }

// storeLog returns a logger for a store and what it writes.
func storeLog() (*slog.Logger, *storetest.Output) {
	out := storetest.NewOutput()
	return slog.New(slog.NewTextHandler(out, nil)), out
}

// TestNotificationSizeBoundary: a watcher that announced a Maximum Packet
// Size gets a notification of exactly that size; the next one, one byte
// larger, it is disconnected for, with DISCONNECT 0x95 (packet too large)
// and a line in the store's log, instead of losing it without a word, as
// the broker drops a PUBLISH larger than a client accepts. The watcher
// used to be left believing the old value.
func TestNotificationSizeBoundary(t *testing.T) {
	logger, log := storeLog()
	srv := startStore(t, localstore.Config{Logger: logger})
	writer := connect(t, srv)
	w := dialRaw(t, srv.Addr(), 0)
	w.connectMax("small-watcher", smallPacket, 0)
	w.watch("small-watcher/response", "k")
	topic := wire.NotifyTopic("small-watcher", []byte("k"))

	mustPayload(t, writer.do(cmd("SET", "k", "v")), okResp)
	n, size := largestFitting(t, w.nextPublish(topic), smallPacket, notifySetPayload)
	if size != smallPacket {
		t.Fatalf("test setup: no notification of exactly %d bytes (%d bytes for a value of %d)", smallPacket, size, n)
	}

	mustPayload(t, writer.do(cmd("SET", "k", strings.Repeat("v", n))), okResp)
	if p := w.nextPublish(topic); wireSize(t, p) != smallPacket || !bytes.Equal(p.Payload, notifySetPayload(n)) {
		t.Fatalf("notification of %d bytes, payload %.40q...; want %d bytes", wireSize(t, p), p.Payload, smallPacket)
	}

	mustPayload(t, writer.do(cmd("SET", "k", strings.Repeat("v", n+1))), okResp)
	var disc *packets.Disconnect
	for {
		p, err := w.tryRead()
		if err != nil {
			break
		}
		switch x := p.Content.(type) {
		case *packets.Publish:
			t.Errorf("got a PUBLISH of %d bytes on %q beyond the maximum %d", wireSize(t, x), x.Topic, smallPacket)
		case *packets.Disconnect:
			disc = x
		}
	}
	if disc == nil || disc.ReasonCode != 0x95 {
		t.Fatalf("DISCONNECT %+v, want reason 0x95 (packet too large)", disc)
	}
	log.WaitFor(t, regexp.MustCompile(`disconnecting client: a notification is larger than its maximum packet size.*client=small-watcher.*notification_bytes=1025 max_packet_size=1024`))
}

// TestResponseSizeBoundary: a response of exactly the Maximum Packet Size
// the client announced is delivered; one byte more, and the request is
// answered with MsgResponseTooLarge at once instead, on a connection that
// goes on. The broker used to drop the response, and the request waited
// for its timeout. With a subscription identifier on the response topic,
// which the broker adds to the response, the boundary moves by its size; a
// client that accepts topic aliases gets none, and the same boundary.
func TestResponseSizeBoundary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		subID   int
		aliases uint16
	}{{"plain", 0, 0}, {"subscription-id", 268435455, 0}, {"topic-aliases", 0, 10}} {
		t.Run(tc.name, func(t *testing.T) {
			subID := tc.subID
			srv := startStore(t, localstore.Config{})
			writer := connect(t, srv)
			c := dialRaw(t, srv.Addr(), 0)
			c.connectMax("small-reader", smallPacket, tc.aliases)
			respTopic := "small-reader/response"
			sub := &packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: respTopic, QoS: 1}},
				Properties: &packets.Properties{}}
			if subID != 0 {
				sub.Properties.SubscriptionIdentifier = &subID
			}
			c.write(sub)
			if sa, ok := c.read().Content.(*packets.Suback); !ok || sa.Reasons[0] != 1 {
				t.Fatalf("SUBACK expected, got %v", sa)
			}

			mustPayload(t, writer.do(cmd("SET", "k", "v")), okResp)
			c.write(c.request(2, respTopic, "GET", "k"))
			like := c.nextPublish(respTopic)
			if got := like.Properties.SubscriptionIdentifier; subID != 0 && (got == nil || *got != subID) {
				t.Fatalf("subscription identifier %v, want %d", got, subID)
			}
			if like.Properties.TopicAlias != nil {
				t.Fatalf("response with topic alias %d", *like.Properties.TopicAlias)
			}
			n, size := largestFitting(t, like, smallPacket, getPayload)
			if size != smallPacket {
				t.Fatalf("test setup: no response of exactly %d bytes (%d bytes for a value of %d)", smallPacket, size, n)
			}

			mustPayload(t, writer.do(cmd("SET", "k", strings.Repeat("v", n))), okResp)
			c.write(c.request(3, respTopic, "GET", "k"))
			if p := c.nextPublish(respTopic); wireSize(t, p) != smallPacket || !bytes.Equal(p.Payload, getPayload(n)) {
				t.Fatalf("response of %d bytes, payload %.40q...; want %d bytes", wireSize(t, p), p.Payload, smallPacket)
			}

			mustPayload(t, writer.do(cmd("SET", "k", strings.Repeat("v", n+1))), okResp)
			c.write(c.request(4, respTopic, "GET", "k"))
			p := c.nextPublish(respTopic)
			if got, want := string(p.Payload), errPayload(localstore.MsgResponseTooLarge); got != want {
				t.Fatalf("GET of a value one byte too large: %.60q..., want %q", got, want)
			}
			if p.Properties.CorrelationData[1] != 4 {
				t.Fatalf("error answers request %d, want 4", p.Properties.CorrelationData[1])
			}
			c.write(c.request(5, respTopic, "GET", "other"))
			if p := c.nextPublish(respTopic); string(p.Payload) != nullResp {
				t.Fatalf("GET after the error: %q", p.Payload)
			}
		})
	}
}

// dialSmall dials an sskv client that accepts packets of at most
// smallPacket bytes.
func dialSmall(t *testing.T, srv *localstore.Server, log *slog.Logger) *sskv.Client {
	t.Helper()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := sskv.Dial(storetest.Ctx(t), sskv.Config{Addr: srv.Addr(), ClientID: storetest.ID(t), MaxPacketSize: smallPacket,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// isTooLarge reports whether err is the store's MsgResponseTooLarge.
func isTooLarge(err error) bool {
	var se *sskv.ServiceError
	return errors.As(err, &se) && se.Message == localstore.MsgResponseTooLarge
}

// TestWatchOfTooLargeValueEnds: an sskv watcher whose key is set to a value
// too large for its client is not left silent, believing the old value:
// the store disconnects the client, which reconnects and reads the key
// again, gets MsgResponseTooLarge, and ends the watch with it. The client
// goes on.
func TestWatchOfTooLargeValueEnds(t *testing.T) {
	logger, log := storeLog()
	srv := startStore(t, localstore.Config{Logger: logger})
	ctx := storetest.Ctx(t)
	small := dialSmall(t, srv, nil)
	writer := storetest.Dial(t, srv.Addr())
	w, err := small.Watch(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-w.Events(); !ev.Initial || ev.Op != sskv.OpDelete {
		t.Fatalf("first event %+v; want Initial DELETE (the key is missing)", ev)
	}
	if _, err := writer.Set(ctx, "big", bytes.Repeat([]byte("v"), 2*smallPacket), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(waitTimeout)
	for ended := false; !ended; {
		select {
		case ev, ok := <-w.Events():
			if ok {
				t.Fatalf("event %v %q... of a value larger than the client accepts", ev.Op, ev.Value[:min(len(ev.Value), 20)])
			}
			ended = true
		case <-timeout:
			t.Fatalf("the watch of a key set to a value too large for its client neither ended nor reported anything in %v", waitTimeout)
		}
	}
	if err := w.Err(); !isTooLarge(err) {
		t.Fatalf("Watcher.Err() = %v, want the store's %q", err, localstore.MsgResponseTooLarge)
	}
	log.WaitFor(t, regexp.MustCompile(`a notification is larger than its maximum packet size`))
	if _, err := small.Set(ctx, "small", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatalf("the client does not go on: %v", err)
	}
	// The ended watch is unregistered: the next too-large SET leaves the
	// client alone.
	storetest.Eventually(t, "the store to stop watching big for the client", func() bool { return !srv.Watching(small.ID(), "big") })
}

// TestGetOfTooLargeValueFails: an sskv GET of a value too large for its
// client fails at once with MsgResponseTooLarge. The broker used to drop
// the response, and the GET waited for its timeout.
func TestGetOfTooLargeValueFails(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx := storetest.Ctx(t)
	small := dialSmall(t, srv, nil)
	writer := storetest.Dial(t, srv.Addr())
	if _, err := writer.Set(ctx, "big", bytes.Repeat([]byte("v"), 2*smallPacket), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	getCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	start := time.Now()
	_, err := small.Get(getCtx, "big")
	if took := time.Since(start); !isTooLarge(err) || took > promptBound {
		t.Fatalf("GET of a value too large for the client: %v after %v, want the store's %q at once", err, took, localstore.MsgResponseTooLarge)
	}
}

// TestFittingClientNotDisconnected: a client with a small Maximum Packet
// Size that is sent nothing too large for it is never disconnected, while
// other clients read, write and watch values far larger than it accepts.
func TestFittingClientNotDisconnected(t *testing.T) {
	logger, log := storeLog()
	srv := startStore(t, localstore.Config{Logger: logger})
	ctx := storetest.Ctx(t)
	clientLog := storetest.NewOutput()
	small := dialSmall(t, srv, slog.New(slog.NewTextHandler(clientLog, nil)))
	big := storetest.Dial(t, srv.Addr())
	smallW, err := small.Watch(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	bigW, err := big.Watch(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	next := func(w *sskv.Watcher) sskv.Event {
		t.Helper()
		select {
		case ev, ok := <-w.Events():
			if !ok {
				t.Fatalf("watch of %q ended: %v", w.Key(), w.Err())
			}
			return ev
		case <-time.After(waitTimeout):
			t.Fatalf("no event for %q", w.Key())
			return sskv.Event{}
		}
	}
	for _, w := range []*sskv.Watcher{smallW, bigW} {
		if ev := next(w); !ev.Initial || ev.Op != sskv.OpDelete {
			t.Fatalf("first event of %q: %+v; want Initial DELETE (the key is missing)", w.Key(), ev)
		}
	}
	for i := range 20 {
		large := bytes.Repeat([]byte{byte('a' + i)}, 64<<10)
		if _, err := big.Set(ctx, "big", large, sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
		if ev := next(bigW); !bytes.Equal(ev.Value, large) || ev.Resync {
			t.Fatalf("big watcher: %v %d bytes (resync %v)", ev.Op, len(ev.Value), ev.Resync)
		}
		if g, err := big.Get(ctx, "big"); err != nil || !bytes.Equal(g.Value, large) {
			t.Fatalf("big GET: %d bytes, %v", len(g.Value), err)
		}
		value := bytes.Repeat([]byte{byte('a' + i)}, 512)
		if _, err := big.Set(ctx, "small", value, sskv.SetOptions{}); err != nil {
			t.Fatal(err)
		}
		if ev := next(smallW); !bytes.Equal(ev.Value, value) || ev.Resync {
			t.Fatalf("small watcher: %v %d bytes (resync %v)", ev.Op, len(ev.Value), ev.Resync)
		}
		if g, err := small.Get(ctx, "small"); err != nil || !bytes.Equal(g.Value, value) {
			t.Fatalf("small GET: %d bytes, %v", len(g.Value), err)
		}
	}
	if s := log.String(); strings.Contains(s, "disconnecting client") {
		t.Errorf("the store disconnected a client:\n%s", s)
	}
	if s := clientLog.String(); strings.Contains(s, "disconnected") || strings.Contains(s, "connection lost") {
		t.Errorf("the small client lost its connection:\n%s", s)
	}
}
