package sskv

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho/store/memory"

	"github.com/dsslock/dsslock/sskv/internal/resp"
)

// sessionStore keeps the client's unacknowledged PUBLISHes for its MQTT
// session (it is the client store of paho's session state), and decides
// what a resumed session may send again. MQTT has a client resend every
// unacknowledged PUBLISH when it resumes its session; for a request that
// would mean executing it after its caller gave up, or on a connection it
// was not meant for. So when paho reads the stored requests back to resend
// them after a reconnect (Get):
//
//   - a request whose caller still waits goes out again, with its Message
//     Expiry set to the time its caller has left;
//   - a request whose caller gave up, or whose deadline has passed, and a
//     request bound to the connection that was lost (see [Conn]), go out as
//     a harmless read of no key (GET of an empty key, which the service
//     refuses without touching anything), under correlation data nobody
//     waits for: the packet id must still be acknowledged by the broker to
//     be freed.
//
// A request still unacknowledged after maxSends connections that the
// broker ended with a DISCONNECT blaming a packet (malformed, too large,
// ...: see badPacketReason) is not sent as it is again: a broker that
// closes the connection over a packet would otherwise get it on every
// reconnect, and the client would never stay connected. It goes out
// disarmed, and its caller gets ErrConnectionLost: it may have been
// executed. Connections lost otherwise (a network cut) do not count: a
// request whose caller still waits is resent across any number of them.
//
// It also refuses (Put) to add a request bound to a connection to the
// session once another connection has been set up, so that such a request
// never goes out on a later connection even if it races with a reconnect.
type sessionStore struct {
	c     *Client
	inner *memory.Store
	seq   atomic.Uint64 // connections set up by paho so far (List is called once for each)

	mu    sync.Mutex
	sends map[uint16]int // connections ended over a bad packet while each stored PUBLISH was unacknowledged
}

// maxSends is how many connections may end over a bad packet while a
// request is unacknowledged before the session stops sending it as it is.
const maxSends = 3

func newSessionStore(c *Client) *sessionStore {
	return &sessionStore{c: c, inner: memory.New(), sends: make(map[uint16]int)}
}

// resend reports whether packet id may go out again as it is, counting the
// connection that ended, if the broker blamed a bad packet for its end.
func (s *sessionStore) resend(id uint16) bool {
	if !s.c.badEnd.Load() {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sends[id]++
	return s.sends[id] < maxSends
}

// errBoundConnGone refuses a request bound to a connection that has been
// replaced: it is not sent.
var errBoundConnGone = errors.New("sskv: the connection the request is bound to was replaced")

func (s *sessionStore) Put(packetID uint16, packetType byte, w io.WriterTo) error {
	if pub, ok := w.(*packets.Publish); ok && pub.Properties != nil && len(pub.Properties.CorrelationData) == 16 {
		if seq, bound := s.c.boundTo([16]byte(pub.Properties.CorrelationData)); bound && seq != s.seq.Load() {
			return errBoundConnGone
		}
	}
	return s.inner.Put(packetID, packetType, w)
}

func (s *sessionStore) Get(packetID uint16) (io.ReadCloser, error) {
	rc, err := s.inner.Get(packetID)
	if err != nil {
		return rc, err
	}
	cp, err := packets.ReadPacket(rc)
	_ = rc.Close()
	if err != nil {
		return s.inner.Get(packetID) // paho reports and quarantines it
	}
	pub, ok := cp.Content.(*packets.Publish)
	if !ok || pub.Topic != s.c.invokeTopic || pub.Properties == nil {
		return s.inner.Get(packetID)
	}
	var corr [16]byte
	copy(corr[:], pub.Properties.CorrelationData)
	left, ok := s.c.resendable(corr)
	switch {
	case ok && !s.resend(packetID):
		s.c.log.Warn("the broker ended the connection over a bad packet each time this request was unacknowledged; not sending it again",
			"connections", maxSends, "bytes", len(pub.Payload))
		s.c.complete(corr, result{err: fmt.Errorf("%w: the broker ended the connection %d times, blaming a packet, before it acknowledged the request", ErrConnectionLost, maxSends)})
		disarm(pub)
	case ok:
		exp := expiryFor(left)
		pub.Properties.MessageExpiry = &exp
	default:
		disarm(pub)
	}
	var buf bytes.Buffer
	if _, err := pub.WriteTo(&buf); err != nil {
		return nil, err
	}
	return io.NopCloser(&buf), nil
}

// disarm turns a stored request into one that cannot change anything: a GET
// of an empty key, which the service answers with an error, under fresh
// correlation data.
func disarm(pub *packets.Publish) {
	pub.Payload = resp.AppendCommand(nil, []byte("GET"), []byte{})
	corr := make([]byte, 16)
	_, _ = rand.Read(corr)
	pub.Properties.CorrelationData = corr
	one := uint32(1)
	pub.Properties.MessageExpiry = &one
}

func (s *sessionStore) Delete(id uint16) error {
	s.mu.Lock()
	delete(s.sends, id)
	s.mu.Unlock()
	return s.inner.Delete(id)
}
func (s *sessionStore) Quarantine(id uint16) error { return s.inner.Quarantine(id) }

// Reset is called by paho when it clears the session (a clean start, or a
// session the broker did not keep): the requests in it will never be
// acknowledged.
func (s *sessionStore) Reset() error {
	s.mu.Lock()
	clear(s.sends)
	s.mu.Unlock()
	err := s.inner.Reset()
	if s.c.pub != nil {
		s.c.pub.endAll()
	}
	return err
}

// List is called by paho once for each connection it sets up, before it
// resends the session's PUBLISHes and before anything new can be sent on
// the connection.
func (s *sessionStore) List() ([]uint16, error) {
	s.seq.Add(1)
	return s.inner.List()
}

// resendable reports whether the request with correlation data corr may be
// sent again on a resumed session, and how long its caller still waits.
func (c *Client) resendable(corr [16]byte) (time.Duration, bool) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	p := c.pending[corr]
	if p == nil || p.bound {
		return 0, false
	}
	left := time.Until(p.deadline)
	return left, left > 0
}

// boundTo reports whether the request with correlation data corr is bound
// to a connection, and the session store's sequence number of that
// connection.
func (c *Client) boundTo(corr [16]byte) (uint64, bool) {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	seq, ok := c.bound[corr]
	return seq, ok
}

// expiryFor is the Message Expiry of a request whose caller waits left
// more: whole seconds, rounded up, at least 1.
func expiryFor(left time.Duration) uint32 {
	if left <= time.Second {
		return 1
	}
	s := (left + time.Second - 1) / time.Second
	if s > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(s)
}
