package localstore

import (
	"errors"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// satMethod is the MQTT v5 enhanced authentication method of Azure IoT
// Operations for Kubernetes service account tokens.
const satMethod = "K8S-SAT"

// hook plugs the state store into the broker: it authenticates clients,
// applies the ACL, tracks each client id's current connection and executes
// requests published to the invoke topic.
type hook struct {
	mqtt.HookBase
	s *Server
}

func (h *hook) ID() string { return "dsslock-statestore" }

func (h *hook) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnSessionEstablish, mqtt.OnSessionEstablished,
		mqtt.OnDisconnect, mqtt.OnPublish, mqtt.OnPacketRead, mqtt.OnPacketEncode, mqtt.OnPublishDropped,
		mqtt.OnQosPublish, mqtt.OnSubscribe, mqtt.OnWill, mqtt.OnRetainedExpired, mqtt.OnRetainPublished:
		return true
	}
	return false
}

// OnConnectAuthenticate accepts everyone when no credentials are configured;
// otherwise a username/password from Config.Users or a K8S-SAT token from
// Config.SATTokens. It then admits the client (see Server.admit). The
// client's user name is from then on the verified one (see authenticate),
// never what CONNECT said.
func (h *hook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user, ok := h.s.authenticate(cl, pk)
	if !ok {
		return false
	}
	cl.Properties.Username = []byte(user)
	if why := h.s.admit(cl); why != "" {
		if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
			dc.refusal = why // its CONNACK says 0x87, not authorized (see OnPacketEncode)
		}
		return false
	}
	return true
}

// OnPacketRead notes when each PUBLISH from a client was read, the moment
// its Message Expiry Interval counts from (see Server.handleRequest), and
// gives each QoS 1 PUBLISH, SUBSCRIBE and UNSUBSCRIBE a packet id of the
// store's choosing, so that the broker does not take the client's packet ids
// for the ids of its own messages to the client (see packetid.go).
func (h *hook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok && pk.FixedHeader.Type == packets.Publish {
		dc.readAt = time.Now()
	}
	renumberInbound(cl, &pk)
	return pk, nil
}

// OnPacketEncode fixes what the broker sends:
//   - A CONNACK refusing a client that authenticated but was not admitted
//     (see Server.admit) says 0x87, not authorized, and why, where the broker
//     would say bad user name or password.
//   - A PUBACK, SUBACK or UNSUBACK carries the packet id the client gave its
//     packet, not the one the store handled it under (see OnPacketRead).
//   - A client that sets Request Problem Information to 0 (paho's default)
//     must still get user properties on PUBLISH [MQTT-3.1.2-29]; the broker
//     strips them from every packet, which would remove __stat and __ts.
//   - A successful CONNACK to a client that used enhanced authentication
//     carries the authentication method, as MQTT v5 requires [MQTT-4.12.0-5].
//   - A SUBACK says quota exceeded (0x97) for the filters refused for
//     Config.MaxSubscriptionsPerClient (see limitSubscriptions).
//   - A successful CONNACK announces Config.MaxPacketSize, so that a client
//     refuses a packet the store would not take instead of being cut off
//     for sending it (mochi enforces Capabilities.MaximumPacketSize but
//     does not announce it).
//
// The broker calls it for every packet it writes, at the bottom of its
// deepest call chains (a SUBACK or a PINGRESP is written on the
// connection's read goroutine, under the broker's frames for reading and
// handling the packet), so it changes pk in place rather than through
// copies of it: each copy of a packets.Packet is 800 bytes of stack. With
// copies, answering a keep-alive PINGREQ needed more than the 16 KiB stack
// an idle connection's read goroutine otherwise shrinks back to, so every
// ping grew it to 32 KiB again: 16 KiB more per idle client.
func (h *hook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Publish:
		pk.Mods.DisallowProblemInfo = false
	case packets.Puback, packets.Unsuback:
		restoreClientPacketID(cl, &pk)
	case packets.Suback:
		fixSuback(cl, &pk) // it knows the id the broker handled the SUBSCRIBE under
		restoreClientPacketID(cl, &pk)
	case packets.Connack:
		h.s.fixConnack(cl, &pk)
	}
	return pk
}

// fixConnack is OnPacketEncode's change to a CONNACK.
func (s *Server) fixConnack(cl *mqtt.Client, pk *packets.Packet) {
	if pk.ReasonCode != packets.CodeSuccess.Code &&
		cl.Properties.ProtocolVersion == 5 { // MQTT 3 has one code for both: 5, not authorized
		if dc, ok := cl.Net.Conn.(*deadlineConn); ok && dc.refusal != "" {
			pk.ReasonCode = packets.ErrNotAuthorized.Code
			pk.Properties.ReasonString = dc.refusal
		}
	}
	if pk.ReasonCode == packets.CodeSuccess.Code &&
		cl.Properties.Props.AuthenticationMethod != "" {
		pk.Properties.AuthenticationMethod = cl.Properties.Props.AuthenticationMethod
	}
	if pk.ReasonCode == packets.CodeSuccess.Code {
		pk.Properties.MaximumPacketSize = uint32(s.cfg.MaxPacketSize)
	}
}

// OnACLCheck applies the topic rules (see acl.go) to what a client
// publishes (write) and to what it subscribes to and receives.
func (h *hook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	switch {
	case cl.Net.Inline:
		return true
	case write:
		return h.s.mayPublish(cl, topic)
	}
	return h.s.mayRead(cl, topic)
}

// OnSessionEstablish runs when a connection has authenticated, before the
// broker sets up its session: it waits for any older connection of the same
// client id to be finished with (see Server.takeOver), and sets what the
// broker sends the client (see noFlowControl and noTopicAliases).
func (h *hook) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	h.s.takeOver(cl)
	noFlowControl(cl)
	noTopicAliases(cl)
}

// noFlowControl switches off the broker's outbound flow control for cl, which
// deadlocks: after each packet it reads from a client with unacknowledged
// messages, mochi v2.7.9 calls Inflight.NextImmediate, which read-locks the
// client's in-flight store twice; a delivery to the client that queues a
// write lock in between (Inflight.Set, from another client's goroutine, with
// the store's lock held) froze both, and then the whole store. With a send
// quota of zero and a maximum of zero that code never runs and no message is
// ever held back. Cost: the store does not enforce a client's Receive Maximum
// (at most Config.MaxPendingMessages, 8192 by default, QoS 1 messages are in
// flight to a client); clients with the usual 65535 never notice.
//
// It runs before the session is set up and again before the client's packets
// are read, since taking over a session resets the quota; a message the
// broker held back in between is sent now.
func noFlowControl(cl *mqtt.Client) {
	cl.State.Inflight.ResetSendQuota(0)
}

// OnSessionEstablished makes cl the current connection of its client id. A
// new connection starts with no watches, even when it resumes a session.
func (h *hook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	noFlowControl(cl)
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
		dc.client.Store(cl)
	}
	for _, held := range cl.State.Inflight.GetAll(true) { // held back while the quota was briefly on
		held.Expiry = 0
		cl.State.Inflight.Set(held)
		_ = cl.WritePacket(held)
	}
	h.s.connMu.Lock()
	h.s.conns[cl.ID] = cl
	h.s.connMu.Unlock()
	h.s.endWatches(cl.ID)
}

// OnDisconnect ends the watches of the client, unless this is the late
// disconnect of a connection that was already replaced by a newer one.
func (h *hook) OnDisconnect(cl *mqtt.Client, err error, expire bool) {
	dropInboundAck(cl)
	h.s.connMu.Lock()
	current := h.s.conns[cl.ID] == cl
	if current {
		delete(h.s.conns, cl.ID)
	}
	h.s.connMu.Unlock()
	if current {
		h.s.endWatches(cl.ID)
	}
}

// OnPublish refuses retained messages under clients/ (see acl.go) and
// beyond the user's limits (see limits.go), and executes state store
// requests. Requests are acknowledged like any QoS 1 PUBLISH but not routed
// to subscribers of the invoke topic, nor retained. Other messages wait for
// room in their subscribers' queues of pending writes (see writequeue.go).
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	if pk.FixedHeader.Retain && !mayRetain(pk.TopicName) {
		h.s.log.Warn("refused retained message under clients/", "client", cl.ID, "topic", pk.TopicName)
		return pk, h.s.refusePublish(cl, pk, packets.ErrNotAuthorized, msgNoRetained)
	}
	if pk.TopicName != wire.InvokeTopic {
		// The broker retains the message once OnPublish has let it through.
		if pk.FixedHeader.Retain && h.s.retainedLimited() &&
			!h.s.retain(userOf(cl), pk.TopicName, retainedSize(pk.TopicName, pk.Payload, pk.Properties)) {
			h.s.log.Warn("refused retained message: "+msgRetainedQuota, "client", cl.ID, "user", userOf(cl), "topic", pk.TopicName)
			return pk, h.s.refusePublish(cl, pk, packets.ErrQuotaExceeded, msgRetainedQuota)
		}
		h.s.waitForSubscribers(pk.TopicName)
		return pk, nil
	}
	if err := h.s.handleRequest(cl, pk); err != nil {
		code := packets.ErrUnspecifiedError
		errors.As(err, &code)
		return pk, h.s.refusePublish(cl, pk, code, "") // not executed; the PUBACK says why
	}
	return pk, packets.CodeSuccessIgnore
}

// OnPublishDropped runs when the broker drops a message to cl because cl's
// queue of pending writes is full (mochi only logs it otherwise): cl is
// disconnected rather than left connected with a message lost.
func (h *hook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	if rec := h.s.recOf(cl); rec != nil {
		h.s.slowClient(rec, "the broker's queue of pending writes is full",
			"pending_writes_limit", h.s.cfg.MaxPendingMessages, "unacknowledged", cl.State.Inflight.Len(),
			"dropped_payload_bytes", len(pk.Payload))
	}
}

// OnQosPublish runs each time the broker adds a QoS 1 or 2 message to cl's
// in-flight store, or sends one again. A client that reaches MaxPendingMessages unacknowledged
// messages is disconnected before the broker would silently drop messages
// to it ("client store quota reached", at Capabilities.MaximumInflight).
//
// A new message is queued for writing right after this returns: it waits
// for room in the client's queue of pending writes first (see
// waitForRoom). Messages sent again (DUP) and acknowledgements are written
// without the queue.
func (h *hook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, sent int64, resends int) {
	noteOutbound(cl, pk)
	if inflight := cl.State.Inflight.Len(); inflight > h.s.cfg.MaxPendingMessages {
		if rec := h.s.recOf(cl); rec != nil {
			h.s.slowClient(rec, "too many unacknowledged messages", "unacknowledged", inflight, "limit", h.s.cfg.MaxPendingMessages)
		}
	}
	if pk.FixedHeader.Type == packets.Publish && !pk.FixedHeader.Dup {
		h.s.waitForRoom(cl)
	}
}

// OnRetainPublished runs after the broker queued a retained message for
// cl, which subscribed to it: the next one waits for room in cl's queue of
// pending writes (see writequeue.go), as a subscription can match many.
func (h *hook) OnRetainPublished(cl *mqtt.Client, pk packets.Packet) {
	h.s.waitForRoom(cl)
}

// OnSubscribe refuses the filters that would take cl beyond
// Config.MaxSubscriptionsPerClient (see limitSubscriptions).
func (h *hook) OnSubscribe(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	return h.s.limitSubscriptions(cl, pk)
}

// OnWill publishes a retained Will without retain where the limits on
// retained messages say so (see limitRetainedWill).
func (h *hook) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	return h.s.limitRetainedWill(cl, will), nil
}

// OnRetainedExpired forgets a retained message the broker dropped because
// its Message Expiry Interval passed.
func (h *hook) OnRetainedExpired(topic string) {
	if h.s.retainedLimited() {
		h.s.forget(topic)
	}
}
