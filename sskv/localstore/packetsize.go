package localstore

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A client announces in CONNECT the largest packet it accepts (Maximum
// Packet Size), and MQTT v5 has the broker discard a larger PUBLISH to it
// without a word [MQTT-3.1.2-25]. mochi does (it first strips the user
// properties, so a packet a little too large could even go through without
// its __stat or __ts). A notification lost so left the watcher believing
// the old value, with neither the change nor a Resync; a response lost so
// left its request waiting for its timeout, and a watch's resync retrying
// its GET forever.
//
// So the store computes the size of each response and notification as the
// broker will write it to the client, before it publishes it:
//
//   - a response that does not fit is replaced by -ERR MsgResponseTooLarge
//     (answer), so the request fails at once, and clearly;
//   - a notification that does not fit disconnects its client with 0x95,
//     packet too large (drain), as a slow client is disconnected rather
//     than left with a notification silently lost: the client reconnects,
//     registers its watches again and reads their keys, and so learns that
//     the value is too large for it.
//
// Ordinary MQTT traffic between clients is the broker's, and is dropped as
// MQTT says.

// maxPacketSize returns the Maximum Packet Size cl announced, 0 for none.
func maxPacketSize(cl *mqtt.Client) int {
	return int(cl.Properties.Props.MaximumPacketSize)
}

// deliveredSize returns the size in bytes, fixed header included, of the
// PUBLISH the broker writes to cl when the store publishes a payload of
// payloadLen bytes to topic with props. It is never less than that size,
// and more only by 2 bytes if cl subscribed at QoS 0 (no packet id), or by
// the identifier of a shared subscription of cl the broker did not select.
// The broker adds no Message Expiry to the store's messages (they have
// none, and Start sets no maximum) and no Topic Alias (see
// noTopicAliases); it adds the identifiers of cl's subscriptions that match
// topic, which are looked up only when they could take the size past max.
func (s *Server) deliveredSize(cl *mqtt.Client, topic string, props packets.Properties, payloadLen, max int) int {
	size := publishSize(topic, props, payloadLen)
	const maxIDSize = 5 // property byte and a variable byte integer of at most 4 bytes
	if size+maxIDSize*cl.State.Subscriptions.Len() > max {
		props.SubscriptionIdentifier = s.subscriptionIDs(cl.ID, topic)
		size = publishSize(topic, props, payloadLen)
	}
	return size
}

// subscriptionIDs returns the subscription identifiers the broker may attach
// to a message on topic for clientID: those of its subscriptions that match
// topic, and of every shared subscription of it that does (the broker
// attaches only the selected one's).
func (s *Server) subscriptionIDs(clientID, topic string) []int {
	subs := s.broker.Topics.Subscribers(topic)
	var ids []int
	for _, id := range subs.Subscriptions[clientID].Identifiers {
		ids = append(ids, id)
	}
	for _, group := range subs.Shared {
		if sub, ok := group[clientID]; ok {
			ids = append(ids, sub.Identifier)
		}
	}
	return ids // the encoder leaves out zeros, as the broker's does
}

// publishSize returns the size of a QoS 1 PUBLISH to topic with props and a
// payload of payloadLen bytes, fixed header included, as the broker encodes
// it. It counts the properties the store's messages can carry: a content
// type, correlation data and user properties (responseProps, notifyProps),
// and subscription identifiers; TestPublishSize checks it against the
// broker's encoder.
func publishSize(topic string, props packets.Properties, payloadLen int) int {
	n := 0 // the properties, each an identifier byte and its value
	if props.ContentType != "" {
		n += 1 + 2 + len(props.ContentType)
	}
	if len(props.CorrelationData) > 0 {
		n += 1 + 2 + len(props.CorrelationData)
	}
	for _, id := range props.SubscriptionIdentifier {
		if id > 0 {
			n += 1 + lengthSize(id)
		}
	}
	for _, u := range props.User {
		n += 1 + 2 + len(u.Key) + 2 + len(u.Val)
	}
	rem := 2 + len(topic) + 2 + lengthSize(n) + n + payloadLen // topic, packet id, properties, payload
	return 1 + lengthSize(rem) + rem
}

// lengthSize is the size of n as an MQTT variable byte integer.
func lengthSize(n int) int {
	size := 1
	for ; n >= 128; n /= 128 {
		size++
	}
	return size
}

// noTopicAliases makes the broker send cl every topic name in full, never a
// Topic Alias, so that the size of a message to cl does not depend on the
// messages sent before it (see deliveredSize). MQTT lets a server use no
// alias whatever Topic Alias Maximum the client announced.
func noTopicAliases(cl *mqtt.Client) {
	cl.Properties.Props.TopicAliasMaximum = 0
}

// codePacketTooLarge is the DISCONNECT reason for a client that the store
// cannot send what it must.
var codePacketTooLarge = packets.ErrPacketTooLarge // 0x95

// answer publishes res, the response to cl's request, to topic (see
// reply), unless it would be larger than the Maximum Packet Size cl
// announced: then an -ERR MsgResponseTooLarge goes in its place, and a
// client that even that does not fit is disconnected with 0x95.
func (s *Server) answer(cl *mqtt.Client, topic string, corr []byte, res result) {
	s.waitForRoom(cl) // for a client that subscribed at QoS 0 too (see writequeue.go)
	max := maxPacketSize(cl)
	if max == 0 {
		s.reply(cl.ID, topic, corr, res)
		return
	}
	size := s.deliveredSize(cl, topic, responseProps(corr, res), len(res.payload), max)
	if size <= max {
		s.reply(cl.ID, topic, corr, res)
		return
	}
	s.log.Warn("answered a request with an error: its response is larger than the client's maximum packet size",
		"client", cl.ID, "response_bytes", size, "max_packet_size", max)
	res = errResult(MsgResponseTooLarge)
	if size := s.deliveredSize(cl, topic, responseProps(corr, res), len(res.payload), max); size > max {
		if rec := s.recOf(cl); rec != nil {
			s.cut(rec, codePacketTooLarge, "disconnecting client: even an error response is larger than its maximum packet size",
				"response_bytes", size, "max_packet_size", max)
		}
		return
	}
	s.reply(cl.ID, topic, corr, res)
}

// fitsNotification reports whether a notification to topic with props and
// payload fits the Maximum Packet Size of rec's client, and disconnects the
// client with 0x95 if it does not.
func (s *Server) fitsNotification(rec *connRec, topic string, props packets.Properties, payloadLen int) bool {
	max := maxPacketSize(rec.cl)
	if max == 0 {
		return true
	}
	size := s.deliveredSize(rec.cl, topic, props, payloadLen, max)
	if size <= max {
		return true
	}
	s.cut(rec, codePacketTooLarge, "disconnecting client: a notification is larger than its maximum packet size",
		"notification_bytes", size, "max_packet_size", max)
	return false
}
