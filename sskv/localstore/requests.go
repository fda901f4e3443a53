package localstore

import (
	"math"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// handleRequest executes a PUBLISH to the invoke topic and publishes the
// response (as the client's ResponseFault says). It runs on the publishing
// client's read goroutine, so the requests of one connection are executed in
// order. A non-nil result is the reason code of the request's PUBACK: the
// request was not executed.
//
// A request whose Message Expiry Interval passes before it is executed,
// counted from the moment the broker read it (see hook.OnPacketRead), is
// dropped: not executed, not answered, and logged, as MQTT requires of a
// message that expired before delivery [MQTT-3.3.2-5]. Its PUBACK is a
// success, as for any such message. A request waits only for the store's
// lock, behind other clients' requests, so its expiry is checked once it
// holds the lock (see serve).
func (s *Server) handleRequest(cl *mqtt.Client, pk packets.Packet) error {
	received := receivedAt(cl)
	n, ok := s.requests.Load(cl.ID)
	if !ok {
		n, _ = s.requests.LoadOrStore(cl.ID, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
	respTopic := pk.Properties.ResponseTopic
	if respTopic == "" {
		s.log.Warn("dropped state store request without response topic", "client", cl.ID)
		return nil
	}
	if wire.ForbiddenResponseTopic(respTopic) {
		s.log.Warn("disconnecting client: forbidden response topic", "client", cl.ID, "topic", respTopic)
		_ = s.broker.DisconnectClient(cl, packets.ErrTopicNameInvalid)
		return nil
	}
	// A response topic one cannot publish to (a wildcard, $SYS) means the
	// response could never reach the caller: refuse the request in its
	// PUBACK rather than execute it with an outcome nobody learns.
	if !mqtt.IsValidFilter(respTopic, true) {
		s.log.Warn("refused state store request: response topic is not a valid topic name", "client", cl.ID, "topic", respTopic)
		return packets.ErrTopicNameInvalid
	}
	// The response goes only where the client could publish it itself: never
	// into another user's namespace (see acl.go).
	if !s.mayPublish(cl, respTopic) {
		s.log.Warn("refused state store request: "+msgRespTopicACL, "client", cl.ID, "user", userOf(cl), "topic", respTopic)
		return packets.ErrNotAuthorized
	}
	// The response would be one more unacknowledged message: beyond the
	// limit, the broker would drop it after the request was executed.
	if inflight := cl.State.Inflight.Len(); inflight >= s.cfg.MaxPendingMessages {
		if rec := s.recOf(cl); rec != nil {
			s.slowClient(rec, "too many unacknowledged messages", "unacknowledged", inflight, "limit", s.cfg.MaxPendingMessages)
		}
		return codeSlowClient
	}
	corr := pk.Properties.CorrelationData
	switch {
	case pk.FixedHeader.Qos != 1:
		s.log.Warn("refused state store request not at QoS 1", "client", cl.ID, "qos", pk.FixedHeader.Qos)
		s.answer(cl, respTopic, corr, errResult(MsgNotQoS1))
		return nil
	case len(corr) == 0:
		s.log.Warn("refused state store request without correlation data", "client", cl.ID)
		s.answer(cl, respTopic, corr, errResult(MsgNoCorrelation))
		return nil
	}

	var expires time.Time
	expiry := time.Duration(pk.Properties.MessageExpiryInterval) * time.Second
	if expiry > 0 {
		expires = received.Add(expiry)
	}
	res, ok := s.serve(clientRef{id: cl.ID, cl: cl}, string(cl.Properties.Username), pk.Payload, pk.Properties.User, expires,
		repeatable{corr: corr, id: clientPacketID(cl, pk.PacketID), expiry: expiry})
	if !ok {
		s.log.Warn("dropped state store request: its message expiry passed before it could be executed",
			"client", cl.ID, "age", time.Since(received), "expiry", expiry)
		return nil
	}
	if b := res.wait; b != nil {
		if !b.finished() {
			s.answerDurable(cl, respTopic, corr, res)
			return nil
		}
		if b.failedFor(res.key) {
			res = errResult(MsgPersistFailed)
		}
	}
	s.answer(cl, respTopic, corr, res)
	return nil
}

// receivedAt returns when the broker read the PUBLISH from cl being handled,
// or now if that is not known.
func receivedAt(cl *mqtt.Client) time.Time {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok && !dc.readAt.IsZero() {
		return dc.readAt
	}
	return time.Now()
}

// serve parses and executes one request payload with its user properties. A
// request that is still waiting for the store's lock at expires (zero: it
// never expires) is not executed: serve then returns false.
//
// A SET, DEL or VDEL with the correlation data, payload and timestamp of
// one of the client's requests answered within its window (see answers)
// is a copy of it that the client's resumed session sent again: it gets
// the answer the first one got, and is not executed again.
func (s *Server) serve(cl clientRef, user string, payload []byte, props []packets.UserProperty, expires time.Time, rep repeatable) (result, bool) {
	var argBuf [8][]byte
	args, err := resp.ParseCommand(payload, argBuf[:0])
	if err != nil {
		return errResult(wire.MsgSyntaxError), true
	}
	req := request{args: args, clientID: cl.id, user: user}
	for _, p := range props {
		switch p.Key {
		case wire.PropTimestamp:
			req.ts, req.hasTS = p.Val, true
		case wire.PropFencingToken:
			req.ft, req.hasFT = p.Val, true
		case wire.PropPersistence:
			req.persist = strings.EqualFold(p.Val, "true")
		}
	}
	// The hashes of a request that may be repeated are taken before the
	// store's lock: its payload may be megabytes.
	keep := len(rep.corr) > 0 && rep.id != 0 && changes(args[0])
	var (
		key  answerKey
		slot answerSlot
	)
	if keep {
		key, slot = s.answered.key(cl.id, rep.corr, payload, req.ts), s.answered.slot(cl.id, rep.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !expires.IsZero() && time.Now().After(expires) {
		return result{}, false
	}
	if keep {
		if res, ok := s.answered.lookup(key, time.Now()); ok {
			s.log.Debug("answered a repeated request as the first time, without executing it again", "client", cl.id, "verb", string(args[0]))
			return res, true
		}
	}
	res := s.execute(cl, &req)
	if res.wait = s.durableAfter(); res.wait != nil && len(req.args) > 1 {
		res.key = string(req.args[1])
	}
	if keep {
		s.answered.keep(key, slot, res, answerWindow(rep.expiry), time.Now())
	}
	return res, true
}

// repeatable is what tells a request's copy from another request: its
// correlation data (nil: none), the packet id the client gave it (0: none
// known), and its Message Expiry Interval (zero: none).
type repeatable struct {
	corr   []byte
	id     uint16
	expiry time.Duration
}

// clientPacketID returns the packet id that cl gave the PUBLISH the broker
// handles under id (see renumberInbound).
func clientPacketID(cl *mqtt.Client, id uint16) uint16 {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok {
		return dc.clientPacketID(id)
	}
	return id
}

// changes reports whether verb is one that may change the store.
func changes(verb []byte) bool {
	switch string(verb) {
	case "SET", "DEL", "VDEL":
		return true
	}
	return false
}

// The store's own -ERR messages, for cases the service's documentation gives
// no text for (see docs/protocol.md): they are this package's, not the
// service's. Official clients never send requests that get the first two.
const (
	// MsgNotQoS1 answers a request published at QoS 0.
	MsgNotQoS1 = "requests must be published with QoS 1"
	// MsgNoCorrelation answers a request without correlation data.
	MsgNoCorrelation = "requests must carry correlation data"
	// MsgClockAhead answers a request while the store's own clock is more
	// than Config.MaxDrift ahead of its wall clock: the wall clock stepped
	// back after the store issued versions. Requests succeed again once the
	// wall clock has caught up (or the drift allows it).
	MsgClockAhead = "the state store's clock is more than the maximum drift ahead of its system clock, which has stepped back; retry once the system clock has caught up"
	// MsgResponseTooLarge answers a request whose response would be larger
	// than the Maximum Packet Size the client announced in CONNECT, which
	// the broker would have to drop (see answer).
	MsgResponseTooLarge = "the response is larger than the client's maximum packet size"
)

// respond publishes a response through the broker.
func (s *Server) respond(topic string, corr []byte, res result) {
	s.publish(topic, res.payload, responseProps(corr, res))
}

// responseProps returns the properties of the response res.
func responseProps(corr []byte, res result) packets.Properties {
	props := packets.Properties{
		CorrelationData: corr,
		ContentType:     wire.ContentType,
		User:            make([]packets.UserProperty, 0, 3),
	}
	props.User = append(props.User,
		packets.UserProperty{Key: wire.PropStatus, Val: wire.StatusOK},
		packets.UserProperty{Key: wire.PropProtocolVer, Val: wire.ProtocolVersion})
	if !res.version.IsZero() {
		props.User = append(props.User, packets.UserProperty{Key: wire.PropTimestamp, Val: res.version.String()})
	}
	return props
}

// publish injects a QoS 1 PUBLISH from the store into the broker, which
// routes it to the subscribers of topic.
func (s *Server) publish(topic string, payload []byte, props packets.Properties) {
	err := s.broker.InjectPacket(s.inline, packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID:    1, // required for QoS 1; the broker assigns each subscriber its own
		TopicName:   topic,
		Payload:     payload,
		Properties:  props,
	})
	if err != nil {
		s.log.Warn("publish failed", "topic", topic, "error", err)
	}
}

// expiryLoop deletes keys when their PX deadline passes, each with a DELETE
// notification. It sleeps until the earliest deadline; set and Close wake it.
func (s *Server) expiryLoop() {
	defer close(s.loopDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		now := s.tab.now()
		for i := s.tab.expired(now); i >= 0; i = s.tab.expired(now) {
			key := string(s.tab.key(i))
			s.removeSlot(i)
			s.notifyDelete(key)
		}
		next, ok := s.tab.nextExpiry()
		s.expiryAt = math.MaxInt64
		if ok {
			s.expiryAt = next
		}
		s.mu.Unlock()

		wait := time.Hour
		if ok {
			wait = s.tab.untilDeadline(next)
		}
		timer.Reset(wait)
		select {
		case <-s.stop:
			return
		case <-timer.C:
		case <-s.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
	}
}

// kickExpiry wakes the expiry loop to recompute its deadline.
func (s *Server) kickExpiry() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}
