package localstore_test

import (
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// connectSession sends CONNECT with a session that outlives the connection
// (clean start as given) and returns the CONNACK.
func (rc *rawConn) connectSession(id string, clean bool) *packets.Connack {
	rc.t.Helper()
	rc.id = id
	if rc.clock == nil {
		rc.clock, _ = hlc.NewClock(id)
	}
	rm, expiry := uint16(65535), uint32(300)
	rc.write(&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: clean,
		KeepAlive: 30, Properties: &packets.Properties{ReceiveMaximum: &rm, SessionExpiryInterval: &expiry}})
	p := rc.read()
	ca, ok := p.Content.(*packets.Connack)
	if !ok || ca.ReasonCode != 0 {
		rc.t.Fatalf("%s: CONNACK expected, got %v", id, p)
	}
	return ca
}

// awaitResponse reads until the PUBLISH on topic with the correlation data
// of request id and the PUBACK of id have both come, and returns the
// PUBLISH, unacknowledged. Other PUBLISHes are acknowledged.
func (rc *rawConn) awaitResponse(topic string, id uint16) *packets.Publish {
	rc.t.Helper()
	var pub *packets.Publish
	acked := false
	for pub == nil || !acked {
		switch p := rc.read().Content.(type) {
		case *packets.Puback:
			if p.PacketID == id {
				acked = true
			}
		case *packets.Publish:
			if p.Topic == topic && p.Properties != nil && len(p.Properties.CorrelationData) == 2 &&
				binary.BigEndian.Uint16(p.Properties.CorrelationData) == id {
				pub = p
				continue
			}
			if p.QoS > 0 {
				rc.write(&packets.Puback{PacketID: p.PacketID, Properties: &packets.Properties{}})
			}
		}
	}
	return pub
}

// A response the store sent on a connection that died before the client got
// it is sent again when the client resumes its session, whatever packet ids
// the client gives its requests. Packet ids of the two directions are
// independent [MQTT-2.2.1-3], but the broker (mochi-mqtt v2.7.9) keeps both
// in one in-flight map per client: an incoming PUBLISH with the packet id of
// an unacknowledged message to the client, its own response included,
// deleted that message from the session, so it was never sent again.
func TestResumedSessionRedeliversResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		first  uint16 // packet id of the request whose response is lost
		second int    // packet id of the next request; -1: that of the response
	}{
		{"distinct packet ids", 500, 600},
		{"response with its request's packet id", 1, 600},
		{"next request with the response's packet id", 500, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startStore(t, localstore.Config{})
			id := "resume-" + strconv.Itoa(int(tc.first)) + "-" + strconv.Itoa(tc.second)
			topic := "clients/" + id + "/response"

			rc := dialRaw(t, srv.Addr(), 0)
			rc.connectSession(id, true)
			rc.subscribe(topic)

			// The client never acknowledges R, the response to the first
			// request: as far as the store can tell, R was lost with the
			// connection.
			rc.write(rc.request(tc.first, topic, "SET", "k", "v1"))
			r := rc.awaitResponse(topic, tc.first)
			if r.QoS != 1 || r.PacketID == 0 {
				t.Fatalf("response: QoS %d, packet id %d; want QoS 1 with a packet id", r.QoS, r.PacketID)
			}
			second := uint16(tc.second)
			if tc.second < 0 {
				second = r.PacketID
			}
			if second == r.PacketID && tc.second >= 0 {
				t.Fatalf("the store gave the response packet id %d, which the test meant not to reuse", r.PacketID)
			}
			rc.write(rc.request(second, topic, "GET", "k"))
			g := rc.awaitResponse(topic, second)
			rc.write(&packets.Puback{PacketID: g.PacketID, Properties: &packets.Properties{}})
			_ = rc.c.Close()

			rc2 := dialRaw(t, srv.Addr(), 0)
			if ca := rc2.connectSession(id, false); !ca.SessionPresent {
				t.Fatal("session not present on reconnect")
			}
			deadline := time.Now().Add(2 * time.Second)
			for {
				_ = rc2.c.SetReadDeadline(deadline)
				p, err := packets.ReadPacket(rc2.r)
				if err != nil {
					t.Fatalf("the response to request %d (its packet id %d) was not sent again on the resumed session: %v",
						tc.first, r.PacketID, err)
				}
				pub, ok := p.Content.(*packets.Publish)
				if !ok || pub.Topic != topic {
					continue
				}
				if pub.Properties != nil && len(pub.Properties.CorrelationData) == 2 &&
					binary.BigEndian.Uint16(pub.Properties.CorrelationData) == tc.first {
					if string(pub.Payload) != string(r.Payload) {
						t.Fatalf("response sent again with payload %q, want %q", pub.Payload, r.Payload)
					}
					return
				}
				if pub.QoS > 0 {
					rc2.write(&packets.Puback{PacketID: pub.PacketID, Properties: &packets.Properties{}})
				}
			}
		})
	}
}

// Every PUBACK carries the packet id the client gave its PUBLISH, though the
// store handles each QoS 1 PUBLISH under a packet id of its own: an executed
// request, a refused one and an ordinary MQTT message alike.
func TestPubackCarriesClientPacketID(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	rc := dialRaw(t, srv.Addr(), 0)
	rc.connectSession("puback-ids", true)
	topic := "clients/puback-ids/response"
	rc.subscribe(topic)
	for _, tc := range []struct {
		pub    *packets.Publish
		reason byte
	}{
		{rc.request(777, topic, "SET", "k", "v"), 0},
		{rc.request(1, topic, "GET", "k"), 0},
		{rc.request(778, "a/+", "GET", "k"), 0x90}, // refused: not a topic name
		{&packets.Publish{QoS: 1, PacketID: 779, Topic: "plain/topic", Payload: []byte("x"), Properties: &packets.Properties{}}, 0},
	} {
		rc.write(tc.pub)
		for {
			p := rc.read()
			if pub, ok := p.Content.(*packets.Publish); ok {
				rc.write(&packets.Puback{PacketID: pub.PacketID, Properties: &packets.Properties{}})
				continue
			}
			ack, ok := p.Content.(*packets.Puback)
			if !ok {
				continue
			}
			if ack.PacketID != tc.pub.PacketID || ack.ReasonCode != tc.reason {
				t.Fatalf("PUBACK id %d reason 0x%02x; want id %d reason 0x%02x",
					ack.PacketID, ack.ReasonCode, tc.pub.PacketID, tc.reason)
			}
			break
		}
	}
}

// A SUBSCRIBE or UNSUBSCRIBE may carry the packet id of a message the store
// sent the client that the client has not acknowledged yet: the two
// directions number their packets independently [MQTT-2.2.1-3]. The broker
// (mochi-mqtt v2.7.9) answered it with 0x91, packet identifier in use, as it
// keeps both directions in one map; an SDK process restarted with the same
// client id then failed to subscribe (interop's TestRestartSameClientID).
// Only the client's own unfinished QoS 2 PUBLISH makes its id in use.
func TestSubscribeIDIndependentOfStoreMessages(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	rc := dialRaw(t, srv.Addr(), 0)
	rc.connectSession("sub-ids", true)
	topic := "clients/sub-ids/response"
	rc.subscribe(topic)
	rc.write(rc.request(2, topic, "SET", "k", "v"))
	resp := rc.awaitResponse(topic, 2) // left unacknowledged
	id := resp.PacketID

	rc.write(&packets.Subscribe{PacketID: id, Subscriptions: []packets.SubOptions{{Topic: "other/topic", QoS: 1}},
		Properties: &packets.Properties{}})
	sa, ok := rc.read().Content.(*packets.Suback)
	if !ok || sa.PacketID != id || len(sa.Reasons) != 1 || sa.Reasons[0] != 1 {
		t.Fatalf("SUBSCRIBE with id %d (that of an unacknowledged message to the client): got %+v, want SUBACK id %d granting QoS 1", id, sa, id)
	}
	rc.write(&packets.Unsubscribe{PacketID: id, Topics: []string{"other/topic"}, Properties: &packets.Properties{}})
	ua, ok := rc.read().Content.(*packets.Unsuback)
	if !ok || ua.PacketID != id || len(ua.Reasons) != 1 || ua.Reasons[0] != 0 {
		t.Fatalf("UNSUBSCRIBE with id %d: got %+v, want UNSUBACK id %d success", id, ua, id)
	}

	// The client's own QoS 2 PUBLISH, PUBREL not sent yet: its id is in use.
	rc.write(&packets.Publish{QoS: 2, PacketID: 900, Topic: "plain/topic", Payload: []byte("x"), Properties: &packets.Properties{}})
	if pr, ok := rc.read().Content.(*packets.Pubrec); !ok || pr.PacketID != 900 {
		t.Fatalf("QoS 2 PUBLISH: got %+v, want PUBREC id 900", pr)
	}
	rc.write(&packets.Subscribe{PacketID: 900, Subscriptions: []packets.SubOptions{{Topic: "other/topic", QoS: 1}},
		Properties: &packets.Properties{}})
	sa, ok = rc.read().Content.(*packets.Suback)
	if !ok || sa.PacketID != 900 || len(sa.Reasons) != 1 || sa.Reasons[0] != 0x91 {
		t.Fatalf("SUBSCRIBE with the id of the client's unfinished QoS 2 PUBLISH: got %+v, want SUBACK id 900 with 0x91", sa)
	}
}
