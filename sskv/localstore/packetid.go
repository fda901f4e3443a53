package localstore

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Packet ids of the two directions of a connection are independent
// [MQTT-2.2.1-3]: a client numbers its PUBLISHes to the store, the store its
// PUBLISHes to the client, and the same id may be in use both ways at once.
// mochi-mqtt v2.7.9 keeps both in one in-flight map per client, keyed by
// packet id, and handling a QoS 1 PUBLISH from the client with id X
//
//   - deletes the entry X (meant for a duplicate of the client's own PUBLISH),
//   - runs the OnPublish hook, where the store executes a request and
//     publishes its response, which can get id X as X is free just then,
//   - stores its PUBACK under X, writes it, and deletes X again.
//
// Whatever message to the client had id X, the request's own response
// included, was thereby removed from the client's session while still
// unacknowledged. On a live connection nothing shows, since the message is
// written anyway; but when the connection died before the client read it, the
// resumed session did not carry it, and the client waited for a response the
// store had sent once and would never send again.
//
// So the store handles each QoS 1 PUBLISH from a client under another packet
// id (spareID), one no message to the client has and that the broker will not
// give one for a long time, and puts the client's id back on the PUBACK
// (OnPacketEncode). QoS 2 PUBLISHes, which state store clients do not send,
// are left as they are: their flow keeps the id in the map until PUBREL.
//
// SUBSCRIBE and UNSUBSCRIBE are renumbered the same way, and their SUBACK and
// UNSUBACK get the client's id back: the broker answers one whose id is in
// the client's in-flight map with 0x91, packet identifier in use, for every
// filter, although the message holding that id may be one the store sent the
// client. A process that restarts with the same client id and resumes its
// session (the Azure IoT Operations Go SDK does by default) gets the messages
// it left unacknowledged again, ids 1, 2, ..., and numbers its own packets
// from 1: its first SUBSCRIBE was refused, and the SDK did not start. A
// client may do that even on a live connection, as it acknowledges a message
// after handling it. Only a QoS 2 PUBLISH of the client's own that is still
// unfinished makes the id in use [MQTT-2.2.1-3]; such a SUBSCRIBE keeps its
// id, and the broker's 0x91.

// inbound is the QoS 1 PUBLISH, SUBSCRIBE or UNSUBSCRIBE of a connection
// being handled: the packet id the client gave it (high 16 bits) and the one
// the broker handles it under (low 16 bits). 0: none yet. Only the
// connection's read goroutine sets it.
func (c *deadlineConn) setInbound(clientID, asID uint16) {
	c.inbound.Store(uint32(clientID)<<16 | uint32(asID))
}

// clientPacketID maps id, the packet id of a PUBACK the broker writes, back to
// the id the client gave the PUBLISH.
func (c *deadlineConn) clientPacketID(id uint16) uint16 {
	v := c.inbound.Load()
	if v != 0 && uint16(v) == id {
		return uint16(v >> 16)
	}
	return id
}

// restoreClientPacketID puts the client's packet id back on pk, the
// acknowledgement of a packet the broker handled under another id.
func restoreClientPacketID(cl *mqtt.Client, pk *packets.Packet) {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
		pk.PacketID = dc.clientPacketID(pk.PacketID)
	}
}

// renumberInbound gives a QoS 1 PUBLISH, a SUBSCRIBE or an UNSUBSCRIBE from
// the client a packet id of the store's choosing for the broker to handle it
// under.
func renumberInbound(cl *mqtt.Client, pk *packets.Packet) {
	if cl.Net.Inline || pk.PacketID == 0 { // no id: the broker refuses the packet as it is
		return
	}
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if pk.FixedHeader.Qos != 1 {
			return
		}
	case packets.Subscribe, packets.Unsubscribe:
		if inflightIs(cl, pk.PacketID, packets.Pubrec) {
			return // the id of the client's own unfinished QoS 2 PUBLISH: in use
		}
	default:
		return
	}
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if !ok {
		return
	}
	id, ok := spareID(cl, uint16(dc.lastOut.Load()))
	if !ok {
		return
	}
	dc.setInbound(pk.PacketID, id)
	pk.PacketID = id
}

// inflightIs reports whether cl's in-flight message id is a packet of type
// typ. It is kept out of line: the broker's Inflight.Get returns an
// 800-byte packet, which would otherwise take room in the frame of every
// caller, on the connection's read path (see hook.OnPacketRead).
//
//go:noinline
func inflightIs(cl *mqtt.Client, id uint16, typ byte) bool {
	m, ok := cl.State.Inflight.Get(id)
	return ok && m.FixedHeader.Type == typ
}

// spareID returns a packet id that no in-flight message of cl has, and that
// the broker will not give a new message for a long time: the broker takes
// the first free id after the last one it gave (last), wrapping at 65535, so
// the id half the ring away from last is one it reaches only after giving
// about 32,768 more, far more than a client can be sent while one of its
// requests is handled. The ids of the messages in flight to the client
// trail last (at most MaxPendingMessages of them), so that id is free
// unless the client has about 32,768 messages unacknowledged, and the
// search costs one lookup: a scan back from last cost one lookup per
// message in flight, on every request, which made a burst of K requests
// cost O(K^2).
func spareID(cl *mqtt.Client, last uint16) (uint16, bool) {
	id := last + 1<<15
	for range 65535 {
		if id != 0 {
			if _, used := cl.State.Inflight.Get(id); !used {
				return id, true
			}
		}
		id--
	}
	return 0, false
}

// noteOutbound records the packet id of a new QoS message to the client.
func noteOutbound(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Dup {
		return // an acknowledgement, or a message sent again
	}
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
		dc.lastOut.Store(uint32(pk.PacketID))
	}
}

// dropInboundAck removes, when the connection ends, the PUBACK the broker
// keeps in cl's session when it could not write it: it carries the id the
// store handled the PUBLISH under, which means nothing to the client (or
// another of its PUBLISHes). The client sends the unacknowledged PUBLISH
// again when it resumes the session [MQTT-4.4.0-1], and gets its PUBACK then.
func dropInboundAck(cl *mqtt.Client) {
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if !ok {
		return
	}
	v := dc.inbound.Load()
	if v == 0 {
		return
	}
	if inflightIs(cl, uint16(v), packets.Puback) {
		cl.State.Inflight.Delete(uint16(v))
	}
}
