package localstore

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Limits on what one user or one connection may make the store keep (see
// Config): keys (commands.go, withinQuota), watches (notify.go, watch),
// subscriptions and retained messages (here). Each exists so that one
// tenant cannot exhaust, for the others, the memory they all share.

// Reason strings of what the limits refuse.
const (
	msgRetainedQuota = "retained message quota exceeded for this user"
	msgSubQuota      = "subscription quota exceeded for this client"
)

// quotaFilter stands in, in a SUBSCRIBE, for a filter refused because of
// MaxSubscriptionsPerClient: the broker refuses it as invalid (0x8F), which
// OnPacketEncode turns into 0x97 in the SUBACK (see subQuota). No filter a
// client sends can be it: a # must be the filter's last character.
const quotaFilter = "#/quota exceeded"

// subQuota records which filters of the SUBSCRIBE being handled were
// refused for MaxSubscriptionsPerClient, until its SUBACK is written. Only
// the connection's read goroutine, which handles the SUBSCRIBE and writes
// its SUBACK, uses it.
type subQuota struct {
	packetID uint16
	refused  []int // indexes of the refused filters
}

// limitSubscriptions refuses the filters of the SUBSCRIBE pk that would
// take cl beyond Config.MaxSubscriptionsPerClient: it replaces them with
// quotaFilter, and notes them for the SUBACK (see fixSuback). Filters cl
// already has, and filters the broker will refuse anyway (invalid ones),
// do not count.
func (s *Server) limitSubscriptions(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	max := s.cfg.MaxSubscriptionsPerClient
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if max == 0 || !ok {
		return pk
	}
	n := cl.State.Subscriptions.Len()
	var refused []int
	var seen map[string]bool
	for i, sub := range pk.Filters {
		if _, has := cl.State.Subscriptions.Get(sub.Filter); has || seen[sub.Filter] || !mqtt.IsValidFilter(sub.Filter, false) {
			continue
		}
		if n < max {
			n++
			if seen == nil {
				seen = make(map[string]bool)
			}
			seen[sub.Filter] = true
			continue
		}
		if refused == nil { // pk.Filters is the packet's own: copy before changing it
			pk.Filters = append(packets.Subscriptions(nil), pk.Filters...)
		}
		refused = append(refused, i)
		pk.Filters[i].Filter = quotaFilter
	}
	if refused != nil {
		s.log.Warn("refused subscriptions: too many subscriptions", "client", cl.ID, "refused", len(refused), "limit", max)
		dc.subQuota = subQuota{packetID: pk.PacketID, refused: refused}
	}
	return pk
}

// fixSuback gives the filters limitSubscriptions refused the reason code
// quota exceeded (0x97) in the SUBACK pk, which the broker wrote as topic
// filter invalid (0x8F). An MQTT 3 client gets the broker's 0x80.
func fixSuback(cl *mqtt.Client, pk *packets.Packet) {
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if !ok || dc.subQuota.refused == nil || dc.subQuota.packetID != pk.PacketID {
		return
	}
	refused := dc.subQuota.refused
	dc.subQuota = subQuota{}
	if cl.Properties.ProtocolVersion != 5 {
		return
	}
	pk.ReasonCodes = append([]byte(nil), pk.ReasonCodes...)
	for _, i := range refused {
		if i < len(pk.ReasonCodes) && pk.ReasonCodes[i] == packets.ErrTopicFilterInvalid.Code {
			pk.ReasonCodes[i] = packets.ErrQuotaExceeded.Code
			pk.Properties.ReasonString = msgSubQuota
		}
	}
}

// retainedLedger records whose each retained message is and what each
// user's retained messages take (see Config.MaxRetainedPerUser). It is
// used only when a limit on retained messages is set.
type retainedLedger struct {
	mu     sync.Mutex
	topics map[string]retainedMsg   // topic -> its retained message
	users  map[string]retainedUsage // user -> what its retained messages take
}

type retainedMsg struct {
	user string
	size int64
}

type retainedUsage struct {
	n     int
	bytes int64
}

// retainedLimited reports whether retained messages are limited.
func (s *Server) retainedLimited() bool {
	return s.cfg.MaxRetainedPerUser > 0 || s.cfg.MaxRetainedBytesPerUser > 0
}

// retain records that user's retained message of size bytes on topic
// replaces whatever is retained there, unless it would take user beyond
// a limit: then it changes nothing and returns false. size 0 is a message
// that clears the topic, always allowed. A message that replaces user's
// own with one no larger is always allowed, so that a user over a limit
// lowered since can still update its messages.
func (s *Server) retain(user, topic string, size int64) bool {
	l := &s.retained
	l.mu.Lock()
	defer l.mu.Unlock()
	old, had := l.topics[topic]
	if size == 0 {
		if had {
			l.release(topic, old)
		}
		return true
	}
	u := l.users[user]
	n, bytes := u.n+1, u.bytes+size
	if had && old.user == user {
		n, bytes = u.n, u.bytes-old.size+size
	}
	if !(had && old.user == user && size <= old.size) &&
		(s.cfg.MaxRetainedPerUser > 0 && n > s.cfg.MaxRetainedPerUser ||
			s.cfg.MaxRetainedBytesPerUser > 0 && bytes > s.cfg.MaxRetainedBytesPerUser) {
		return false
	}
	if had {
		l.release(topic, old)
	}
	if l.topics == nil {
		l.topics, l.users = make(map[string]retainedMsg), make(map[string]retainedUsage)
	}
	l.topics[topic] = retainedMsg{user: user, size: size}
	u = l.users[user]
	u.n++
	u.bytes += size
	l.users[user] = u
	return true
}

// release removes the retained message m on topic. The caller holds l.mu.
func (l *retainedLedger) release(topic string, m retainedMsg) {
	delete(l.topics, topic)
	u := l.users[m.user]
	u.n--
	u.bytes -= m.size
	if u.n <= 0 {
		delete(l.users, m.user)
		return
	}
	l.users[m.user] = u
}

// forget removes the retained message on topic, which the broker dropped
// (it expired).
func (s *Server) forget(topic string) {
	l := &s.retained
	l.mu.Lock()
	defer l.mu.Unlock()
	if m, ok := l.topics[topic]; ok {
		l.release(topic, m)
	}
}

// retainedSize is what a retained message takes, as it counts against
// MaxRetainedBytesPerUser: its topic, payload and properties. An empty
// payload clears a retained message: its size is 0.
func retainedSize(topic string, payload []byte, props packets.Properties) int64 {
	if len(payload) == 0 {
		return 0
	}
	n := len(topic) + len(payload) + len(props.ResponseTopic) + len(props.CorrelationData) + len(props.ContentType)
	for _, p := range props.User {
		n += len(p.Key) + len(p.Val)
	}
	return int64(n)
}

// limitRetainedWill applies the limits on retained messages to the Will of
// cl, about to be published: one that would take its user beyond a limit,
// or that is delayed (it could be published long after this check), is
// published without retain.
func (s *Server) limitRetainedWill(cl *mqtt.Client, will mqtt.Will) mqtt.Will {
	if !will.Retain || !s.retainedLimited() {
		return will
	}
	switch {
	case will.WillDelayInterval > 0:
		s.log.Warn("publishing a delayed will without retain: retained messages are limited", "client", cl.ID, "topic", will.TopicName)
		will.Retain = false
	case !s.retain(userOf(cl), will.TopicName, retainedSize(will.TopicName, will.Payload, packets.Properties{User: will.User})):
		s.log.Warn("publishing a will without retain: "+msgRetainedQuota, "client", cl.ID, "user", userOf(cl), "topic", will.TopicName)
		will.Retain = false
	}
	return will
}
