package localstore

import (
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A client's identity is its user name and its client id. The user name is
// what the store verified, never what CONNECT merely says:
//
//   - the user of a Config.Users entry whose password the client gave;
//   - the user a Config.SATTokens token maps to;
//   - when neither Users nor SATTokens is set, the Subject CommonName of a
//     client certificate the TLS listener verified (Config.TLS with
//     ClientAuth VerifyClientCertIfGiven or RequireAndVerifyClientCert);
//   - otherwise "", the anonymous user, whatever user name CONNECT carries.
//
// A client id belongs to the user of its connection while it is connected
// (see tenants).

// authenticate returns the verified user name of the client connecting with
// the CONNECT packet pk, or false if it must be refused (its CONNACK then
// says bad user name or password).
func (s *Server) authenticate(cl *mqtt.Client, pk packets.Packet) (string, bool) {
	cfg := &s.cfg
	if method := pk.Properties.AuthenticationMethod; method != "" {
		if method != satMethod || cfg.SATTokens == nil {
			s.log.Warn("refused connection: unsupported authentication method", "client", cl.ID, "method", method)
			return "", false
		}
		user, ok := cfg.SATTokens[string(pk.Properties.AuthenticationData)]
		if !ok {
			s.log.Warn("refused connection: unknown service account token", "client", cl.ID)
			return "", false
		}
		return user, true
	}
	if cfg.Users != nil || cfg.SATTokens != nil {
		want, ok := cfg.Users[string(pk.Connect.Username)]
		if !ok || subtle.ConstantTimeCompare([]byte(want), pk.Connect.Password) != 1 {
			s.log.Warn("refused connection: bad username or password", "client", cl.ID)
			return "", false
		}
		return string(pk.Connect.Username), true
	}
	cn, ok := verifiedCommonName(cl)
	if !ok {
		return "", true // anonymous, whatever CONNECT says
	}
	if cn == "" {
		s.log.Warn("refused connection: client certificate without a Subject CommonName", "client", cl.ID)
		return "", false
	}
	return cn, true
}

// verifiedCommonName returns the Subject CommonName of the client
// certificate that cl's TLS connection verified. ok is false when there is
// none: a plain connection, no certificate, or one the listener did not
// verify (ClientAuth RequestClientCert or RequireAnyClientCert).
func verifiedCommonName(cl *mqtt.Client) (cn string, ok bool) {
	dc, isDC := cl.Net.Conn.(*deadlineConn)
	if !isDC {
		return "", false
	}
	tc, isTLS := dc.Conn.(*tls.Conn)
	if !isTLS {
		return "", false
	}
	st := tc.ConnectionState() // the handshake completed before CONNECT could be read
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return "", false
	}
	return st.PeerCertificates[0].Subject.CommonName, true
}

// verifiesClientCerts reports whether a TLS listener with cfg may verify
// the client certificates it gets (with GetConfigForClient, a connection's
// own configuration decides; verifiedCommonName looks at what was done).
func verifiesClientCerts(cfg *tls.Config) bool {
	return cfg != nil && (cfg.ClientAuth == tls.VerifyClientCertIfGiven || cfg.ClientAuth == tls.RequireAndVerifyClientCert ||
		cfg.GetConfigForClient != nil)
}

// checkIdentityConfig refuses a Config whose KeyPrefixes name users no
// client can be verified as: without Users, SATTokens or verified client
// certificates every client is anonymous (user ""), so such an entry could
// only ever be meant for a name taken from CONNECT, which the store never
// trusts.
func checkIdentityConfig(cfg *Config) error {
	if cfg.Users != nil || cfg.SATTokens != nil || verifiesClientCerts(cfg.TLS) {
		return nil
	}
	var named []string
	for user := range cfg.KeyPrefixes {
		if user != "" {
			named = append(named, user)
		}
	}
	if len(named) == 0 {
		return nil
	}
	sort.Strings(named)
	return fmt.Errorf("localstore: KeyPrefixes names users (%q), but no client can be verified as one: "+
		"set Users, SATTokens, or Config.TLS with ClientAuth VerifyClientCertIfGiven or RequireAndVerifyClientCert; "+
		"without them every client is the anonymous user \"\"", named)
}

// Client namespaces. A client's own topics are those under
// clients/<segment>/, for each of its segments (see segments); the store's
// are under clients/statestore/.
const (
	clientsPrefix = "clients/"
	storeSegment  = "statestore"
)

// segments returns the namespace segments of a client id: the upper-case hex
// of the id (the Go SDK's response topics), and the id itself (sskv's, the
// .NET and Rust SDKs') when it is one topic level that is not the store's.
func segments(clientID string) []string {
	h := strings.ToUpper(hex.EncodeToString([]byte(clientID)))
	if clientID == "" || clientID == storeSegment || strings.ContainsAny(clientID, "/+#") {
		return []string{h}
	}
	return []string{clientID, h}
}

// ownSegment reports whether seg is one of clientID's segments.
func ownSegment(clientID, seg string) bool {
	if seg == clientID {
		return seg != "" && seg != storeSegment && !strings.ContainsAny(seg, "/+#")
	}
	return isUpperHexOf(seg, clientID)
}

// tenants records which user each client id and each client namespace
// segment belongs to, and which segments live connections use. The zero
// value is ready to use.
//
// A client id belongs to the user of its live connections (authenticated,
// and not yet finished with): another user's CONNECT with it is refused. Two
// client ids can share a segment (the id "41" is the upper-case hex of the id
// "A"); a live connection of either then keeps the other from another user
// too. Once no connection of the id is up, any user may connect with it
// (credentials can change identity, as a rotated token can): the id's
// segments then become that user's, and what the session the broker kept for
// the id holds under the previous user is dropped, never inherited (see
// Server.scrubSession).
//
// A segment stays with the last user that claimed it after its connections
// end, so that nobody else publishes into it, or reads from it, while its
// clients are away. Nothing is ever removed from owner and session: one
// entry or two per client id the store has seen.
type tenants struct {
	mu      sync.RWMutex
	owner   map[string]string // segment -> user
	live    map[string]int    // segment -> live connections using it
	session map[string]string // client id -> the user of its last connection
}

// claim makes clientID's segments user's for a new connection, which
// release must end. It fails, changing nothing, while one of them is in use
// by a live connection of another user. userChanged reports that the id's
// last connection was another user's.
func (t *tenants) claim(clientID, user string) (userChanged, ok bool) {
	segs := segments(clientID)
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, seg := range segs {
		if u, owned := t.owner[seg]; owned && u != user && t.live[seg] > 0 {
			return false, false
		}
	}
	if t.owner == nil {
		t.owner, t.live, t.session = make(map[string]string), make(map[string]int), make(map[string]string)
	}
	for _, seg := range segs {
		t.owner[seg] = user
		t.live[seg]++
	}
	prev, seen := t.session[clientID]
	t.session[clientID] = user
	return seen && prev != user, true
}

// release ends a connection of clientID that claim admitted.
func (t *tenants) release(clientID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, seg := range segments(clientID) {
		if t.live[seg]--; t.live[seg] <= 0 {
			delete(t.live, seg)
		}
	}
}

// ownedBy reports whether the namespace segment seg belongs to user.
func (t *tenants) ownedBy(seg, user string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	u, ok := t.owner[seg]
	return ok && u == user
}

// Reason strings of what the store refuses a client that authenticated.
const (
	msgIDTaken      = "the client identifier is in use by another user"
	msgWillTopic    = "a will under clients/ must be on the client's own namespace, neither retained nor delayed"
	msgNoRetained   = "retained messages are not allowed under clients/"
	msgRespTopicACL = "the response topic is in another user's namespace, or the state store's"
)

// admit decides whether cl, authenticated (its user name is the verified
// one), may connect, and if so claims its client id for its user (see
// tenants). It returns why cl is refused, or "".
//
// A Will is published when the connection ends, or later (Will Delay
// Interval), but checked only here: one under clients/ must be on the
// client's own namespace, which stays its own while it is connected, and be
// neither retained nor delayed. Anywhere else under clients/ could by then
// belong to another user (see tenants).
func (s *Server) admit(cl *mqtt.Client) string {
	user := userOf(cl)
	if will := &cl.Properties.Will; atomic.LoadUint32(&will.Flag) == 1 {
		if seg, protected := clientsSegment(will.TopicName); protected &&
			(!ownSegment(cl.ID, seg) || will.Retain || will.WillDelayInterval > 0) {
			s.log.Warn("refused connection: will under clients/ not allowed", "client", cl.ID, "user", user,
				"topic", will.TopicName, "retain", will.Retain, "delay", will.WillDelayInterval)
			return msgWillTopic
		}
	}
	userChanged, ok := s.tenants.claim(cl.ID, user)
	if !ok {
		s.log.Warn("refused connection: the client id is in use by another user", "client", cl.ID, "user", user)
		return msgIDTaken
	}
	if dc, isDC := cl.Net.Conn.(*deadlineConn); isDC {
		dc.claimed = cl.ID
	}
	if userChanged {
		s.scrubSession(cl)
	}
	return ""
}

// scrubSession prepares the session the broker keeps for cl's client id,
// whose connections have all ended and were another user's (see
// tenants.claim), for cl to take over: the messages waiting in it, delivered
// under that user, are dropped, and so are the subscriptions cl may not
// make. The rest (subscriptions to the id's own namespaces, which are now
// cl's user's, and to ordinary topics) is inherited as usual, so that a
// client whose credentials changed from one user to another keeps its
// session across the reconnect.
func (s *Server) scrubSession(cl *mqtt.Client) {
	old, ok := s.broker.Clients.Get(cl.ID)
	if !ok {
		return
	}
	dropped := 0
	for filter := range old.State.Subscriptions.GetAll() {
		if !s.mayRead(cl, filter) {
			s.broker.Topics.Unsubscribe(filter, cl.ID)
			old.State.Subscriptions.Delete(filter)
			dropped++
		}
	}
	s.log.Info("the session of a client id now used by another user: dropped its waiting messages and the subscriptions the new user may not make",
		"client", cl.ID, "user", userOf(cl), "messages", old.State.Inflight.Len(), "subscriptions", dropped)
	old.ClearInflights()
}
