package localstore

import (
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// The topic rules (docs/localstore.md, "Tenants", gives them in full). Topics under
// clients/ are protected; every other topic is an ordinary MQTT topic.
//
//   - clients/statestore/...: the store's. Only the store publishes there,
//     and a client reads only its own notification topics,
//     clients/statestore/v1/<service id>/<HEX(client id)>/...
//   - clients/<segment>/...: the namespace of the client ids whose segment
//     it is (see segments), which belongs to their user (see tenants). A
//     client publishes there, names a response topic there, and reads from
//     there, only if the segment belongs to its own user.
//
// A PUBLISH and a request's response topic must be a topic the client may
// publish to; a retained message under clients/ is refused, and so is a
// Will there anywhere but on the client's own namespace (see
// Server.admit). A subscription filter is checked for what it could match:
//
//   - A filter that can match only topics the client may not read is
//     refused (SUBACK 0x87).
//   - A filter that can match some, like # or clients/+/x, is granted and
//     narrowed: the broker checks each message against the recipient
//     before delivery, so the client never gets the others.
//   - A shared subscription is granted only when everything it can match
//     is readable: the broker picks one member of a group per message
//     before that check, so a member that may not read it would swallow
//     the message of every other member. The store's own group, through
//     which it delivers notifications (watchGroupName), is refused outright.

// userOf returns the verified user of a connected client (see
// authenticate, which stores it as the client's user name).
func userOf(cl *mqtt.Client) string { return string(cl.Properties.Username) }

// clientsSegment returns the namespace segment of a topic under clients/:
// its second level. ok is false for any other topic.
func clientsSegment(topic string) (seg string, ok bool) {
	rest, ok := strings.CutPrefix(topic, clientsPrefix)
	if !ok {
		return "", false
	}
	seg, _, _ = strings.Cut(rest, "/")
	return seg, true
}

// mayUseSegment reports whether cl may publish to, and read, the namespace
// clients/<seg>/: seg belongs to its user (its own segments do while it is
// connected; see tenants). The store's namespace is nobody's.
func (s *Server) mayUseSegment(cl *mqtt.Client, seg string) bool {
	switch {
	case seg == storeSegment:
		return false
	case !cl.Closed() && ownSegment(cl.ID, seg):
		// A live connection's own segments are its user's: no other user
		// can claim them until it has ended. The shortcut spares the table's
		// lock on every response delivered.
		return true
	}
	return s.tenants.ownedBy(seg, userOf(cl))
}

// mayPublish reports whether cl may publish to topic, a topic name: as a
// PUBLISH, as its Will, or as the response topic of its requests.
func (s *Server) mayPublish(cl *mqtt.Client, topic string) bool {
	seg, ok := clientsSegment(topic)
	return !ok || s.mayUseSegment(cl, seg)
}

// mayRetain reports whether a retained message may be published to topic.
func mayRetain(topic string) bool {
	_, protected := clientsSegment(topic)
	return !protected
}

// scope is how much of what a topic filter can match a client may read.
type scope int

const (
	readsNone scope = iota
	readsSome
	readsAll
)

// mayRead reports whether cl may subscribe to filter, or receive a message
// on filter (then a topic name); see the rules above.
func (s *Server) mayRead(cl *mqtt.Client, filter string) bool {
	if rest, shared := cutSharePrefix(filter); shared {
		group, f, _ := strings.Cut(rest, "/")
		return group != watchGroupName && s.readScope(cl, f) == readsAll
	}
	return s.readScope(cl, filter) != readsNone
}

// cutSharePrefix removes "$share/" from a shared subscription's filter,
// spelled in any case as the broker accepts it.
func cutSharePrefix(filter string) (string, bool) {
	const p = "$share/"
	if len(filter) < len(p) || !strings.EqualFold(filter[:len(p)], p) {
		return "", false
	}
	return filter[len(p):], true
}

// readScope returns how much of what filter (or a topic name) matches cl
// may read.
func (s *Server) readScope(cl *mqtt.Client, filter string) scope {
	first, rest, more := strings.Cut(filter, "/")
	switch first {
	case "#":
		return readsSome
	case "+":
		if !more {
			return readsAll // one-level topics, "clients" among them, are ordinary
		}
		// Other first levels are ordinary topics: all readable.
		if s.clientsScope(cl, rest) == readsAll {
			return readsAll
		}
		return readsSome
	case "clients":
		if !more {
			return readsAll
		}
		return s.clientsScope(cl, rest)
	}
	return readsAll
}

// clientsScope is readScope for the filter clients/<rest>.
func (s *Server) clientsScope(cl *mqtt.Client, rest string) scope {
	seg, sub, more := strings.Cut(rest, "/")
	switch seg {
	case "#", "+":
		return readsSome // the client's own namespace, and others'
	case storeSegment:
		return notifyScope(cl.ID, sub, more)
	}
	if s.mayUseSegment(cl, seg) {
		return readsAll
	}
	return readsNone
}

// notifyLevels are the levels of wire.NotifyPrefix after clients/statestore/:
// "v1" and the service id.
var notifyLevels = strings.Split(strings.TrimPrefix(wire.NotifyPrefix, clientsPrefix+storeSegment+"/"), "/")

// notifyScope is readScope for the filter clients/statestore/<sub> (more:
// <sub> is there): only the client's own notification topics,
// clients/statestore/v1/<service id>/<HEX(clientID)>[/...], are readable.
func notifyScope(clientID, sub string, more bool) scope {
	for i := 0; i <= len(notifyLevels); i++ {
		if !more {
			return readsNone // above the client's own topics
		}
		var level string
		level, sub, more = strings.Cut(sub, "/")
		switch {
		case level == "#" || level == "+":
			return readsSome
		case i < len(notifyLevels) && level == notifyLevels[i]:
		case i == len(notifyLevels) && isUpperHexOf(level, clientID):
		default:
			return readsNone
		}
	}
	return readsAll
}

// isUpperHexOf reports whether h is the upper-case hex of s, without
// allocating: it runs for every message delivered on a notification topic.
func isUpperHexOf(h, s string) bool {
	const digits = "0123456789ABCDEF"
	if len(h) != 2*len(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if h[2*i] != digits[s[i]>>4] || h[2*i+1] != digits[s[i]&0x0f] {
			return false
		}
	}
	return true
}

// refusePublish refuses a PUBLISH from cl in OnPublish, as the broker
// refuses one its ACL check does not allow: a QoS 0 message is dropped, an
// MQTT 3 client (which has no reason codes) disconnected, and an MQTT 5
// client gets a PUBACK (or, at QoS 2, a PUBREC) with code and why. The
// message goes nowhere: returned from OnPublish, the error makes the broker
// drop it. (A reason code returned from OnPublish instead would be
// acknowledged at QoS 1 only, and the message routed and retained
// otherwise.)
func (s *Server) refusePublish(cl *mqtt.Client, pk packets.Packet, code packets.Code, why string) error {
	if why == "" {
		why = code.Reason
	}
	switch {
	case pk.FixedHeader.Qos == 0:
	case cl.Properties.ProtocolVersion != 5:
		_ = s.broker.DisconnectClient(cl, code)
	default:
		typ := byte(packets.Puback)
		if pk.FixedHeader.Qos == 2 {
			typ = packets.Pubrec
		}
		_ = cl.WritePacket(packets.Packet{
			FixedHeader: packets.FixedHeader{Type: typ},
			PacketID:    pk.PacketID, // a QoS 1 PUBACK gets the client's id back in OnPacketEncode
			ReasonCode:  code.Code,
			Properties:  packets.Properties{ReasonString: why},
		})
	}
	return packets.ErrRejectPacket
}
