package localstore_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// The tenant tests: alice (keys a/) attacks bob (keys b/) on a store where
// both authenticate with a password (see doc.go, "Tenants").

const (
	reasonNotAuthorized = 0x87
	watchGroup          = "$share/dsslock-localstore-watch/"
)

var (
	alice = connOpts{username: "alice", password: "alice-pw"}
	bob   = connOpts{username: "bob", password: "bob-pw"}
)

func startTenants(t testing.TB) *localstore.Server {
	t.Helper()
	return startStore(t, localstore.Config{
		Users:       map[string]string{"alice": "alice-pw", "bob": "bob-pw"},
		KeyPrefixes: map[string][]string{"alice": {"a/"}, "bob": {"b/"}},
	})
}

// as returns o with client id id.
func as(o connOpts, id string) connOpts { o.id = id; return o }

// connectRaw sends c on a new connection and returns the connection and
// the CONNACK.
func connectRaw(t testing.TB, srv *localstore.Server, c *packets.Connect) (*rawConn, *packets.Connack) {
	t.Helper()
	rc := dialRaw(t, srv.Addr(), 0)
	rc.id = c.ClientID
	rc.clock, _ = hlc.NewClock(c.ClientID)
	c.ProtocolName, c.ProtocolVersion = "MQTT", 5
	if c.Properties == nil {
		c.Properties = &packets.Properties{}
	}
	rc.write(c)
	ca, ok := rc.read().Content.(*packets.Connack)
	if !ok {
		t.Fatalf("%s: no CONNACK", c.ClientID)
	}
	return rc, ca
}

// will is a CONNECT as alice, with a Will.
func will(id, topic string, retain bool, payload []byte, ts string) *packets.Connect {
	c := &packets.Connect{ClientID: id, KeepAlive: 30, CleanStart: true, UsernameFlag: true, Username: alice.username,
		PasswordFlag: true, Password: []byte(alice.password), WillFlag: true, WillQOS: 1, WillRetain: retain,
		WillTopic: topic, WillMessage: payload, WillProperties: &packets.Properties{}}
	if ts != "" {
		c.WillProperties.User = []packets.User{{Key: wire.PropTimestamp, Value: ts}}
	}
	return c
}

// dropAndWait cuts rc's connection without a DISCONNECT, which sends its
// Will, and waits until the store has finished with it.
func dropAndWait(t testing.TB, srv *localstore.Server, rc *rawConn) {
	t.Helper()
	_ = rc.c.Close()
	deadline := time.Now().Add(waitTimeout)
	for srv.Connected(rc.id) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still connected", rc.id)
		}
		time.Sleep(time.Millisecond)
	}
}

// aheadTS is a timestamp 50 s ahead of now: within the store's drift, and
// ahead of every version the store gives for a while.
func aheadTS(t testing.TB) string {
	c, err := hlc.NewClock("mallory", hlc.WithWallClock(func() time.Time { return time.Now().Add(50 * time.Second) }))
	if err != nil {
		t.Fatal(err)
	}
	return c.Now().String()
}

// notifySet is the payload of a notification of a SET to v.
func notifySet(v string) []byte {
	return resp.AppendCommand(nil, []byte("NOTIFY"), []byte("SET"), []byte("VALUE"), []byte(v))
}

// notifyDelete is the payload of a notification of a deletion.
var notifyDelete = resp.AppendCommand(nil, []byte("NOTIFY"), []byte("DELETE"))

// TestTenantWillForgery (issue 16, item 1): alice cannot forge bob's
// notifications, or anything else under his namespace or the store's, with
// a Will; under clients/ a Will must be on her own namespace, neither
// retained nor delayed.
func TestTenantWillForgery(t *testing.T) {
	srv := startTenants(t)
	b := connect(t, srv, bob)
	mustPayload(t, b.do(cmd("KEYNOTIFY", "b/k")), okResp)
	ts := aheadTS(t)
	own := "clients/alice-will/services/statestore/_any_/command/invoke/response"
	delayed := will("alice-will", own, false, []byte("bye"), "")
	delayed.WillProperties.WillDelayInterval = new(uint32)
	*delayed.WillProperties.WillDelayInterval = 1
	for i, w := range []*packets.Connect{
		will("alice-will", wire.NotifyTopic(b.id, []byte("b/k")), false, notifySet("forged"), ts),
		will("alice-will", wire.NotifyTopic(b.id, []byte("b/k")), true, notifyDelete, ts),
		will("alice-will", b.respTopc, false, []byte("+OK\r\n"), ""),
		will("alice-will", wire.NotifyPrefix+"/x", false, []byte("bye"), ""),
		will("alice-will", "clients/statestore/other", false, []byte("bye"), ""),
		will("alice-will", own, true, []byte("bye"), ""), // her own namespace, but retained
		delayed, // her own namespace, but delayed
	} {
		rc, ca := connectRaw(t, srv, w)
		if ca.ReasonCode != reasonNotAuthorized {
			t.Errorf("will %d on %q (retain %v): CONNACK 0x%02x, want 0x87", i, w.WillTopic, w.WillRetain, ca.ReasonCode)
			dropAndWait(t, srv, rc)
		}
	}
	// Wills alice may leave: on her own namespace, on an ordinary topic
	// (retained there too).
	for _, w := range []*packets.Connect{will("alice-will", own, false, []byte("bye"), ""), will("alice-will", "news/alice", true, []byte("bye"), "")} {
		rc, ca := connectRaw(t, srv, w)
		if ca.ReasonCode != 0 {
			t.Fatalf("will on %q (retain %v): CONNACK 0x%02x, want success", w.WillTopic, w.WillRetain, ca.ReasonCode)
		}
		dropAndWait(t, srv, rc)
	}

	// bob's next notification is the one his own write causes, and nothing
	// retained waits for him on his notification topics.
	mustPayload(t, b.do(cmd("SET", "b/k", "real")), okResp)
	if n := b.next(); string(n.Payload) != string(notifySet("real")) {
		t.Fatalf("bob's notification: %q, want his own SET", n.Payload)
	}
	b.subscribe(wire.NotifyFilter(b.id))
	b.do(cmd("GET", "b/k"))
	b.noMessage()
}

// subReason subscribes rc to filter and returns the SUBACK's reason code.
func subReason(t testing.TB, rc *rawClient, filter string) byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil && (sa == nil || len(sa.Reasons) != 1) {
		t.Fatalf("subscribe %q: %v", filter, err)
	}
	return sa.Reasons[0]
}

// TestTenantResponsesPrivate (issue 16, item 2): alice cannot read bob's
// responses, nor learn his client id from topic names: a filter that can
// match only his topics is refused, a wider one is narrowed to what she may
// read, and a shared one that could match another client's topics is
// refused (its deliveries cannot be narrowed).
func TestTenantResponsesPrivate(t *testing.T) {
	srv := startTenants(t)
	b := connect(t, srv, bob)
	a := connect(t, srv, alice)
	mustPayload(t, b.do(cmd("SET", "b/secret", "s3cret")), okResp)

	for _, f := range []string{
		b.respTopc, "clients/" + b.id + "/#", "clients/" + upperHex(b.id) + "/#",
		"$share/g/#", "$SHARE/g/#", "$share/g/clients/#", "$share/g/+/#", "$share/g/clients/+/services/#",
		"$share/g/" + b.respTopc, "clients/statestore", wire.NotifyFilter(b.id),
	} {
		if code := subReason(t, a, f); code != reasonNotAuthorized {
			t.Errorf("alice's subscription to %q: SUBACK 0x%02x, want 0x87", f, code)
		}
	}
	for _, f := range []string{"#", "+/#", "clients/#", "clients/+/services/statestore/_any_/command/invoke/response", "+/" + b.id + "/#"} {
		if code := subReason(t, a, f); code > 2 {
			t.Errorf("alice's subscription to %q: SUBACK 0x%02x, want granted (and narrowed)", f, code)
		}
	}
	// Shared subscriptions within her own namespace are hers.
	if code := subReason(t, a, "$share/g/clients/"+a.id+"/#"); code > 2 {
		t.Errorf("alice's shared subscription to her namespace: SUBACK 0x%02x", code)
	}

	mustPayload(t, b.do(cmd("GET", "b/secret")), "$6\r\ns3cret\r\n")
	a.do(cmd("GET", "a/k")) // on alice's connection, after anything bob's GET sent her
	for {
		select {
		case p := <-a.other:
			if strings.HasPrefix(p.Topic, "clients/") || strings.Contains(string(p.Payload), "s3cret") {
				t.Fatalf("alice received %q on %q", p.Payload, p.Topic)
			}
			continue
		default:
		}
		break
	}
}

// TestTenantResponseInjection (issue 16, item 3): alice cannot publish into
// bob's namespace, nor have the store answer there for her.
func TestTenantResponseInjection(t *testing.T) {
	srv := startTenants(t)
	b := connect(t, srv, bob)
	a := connect(t, srv, alice)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()

	pr, err := a.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: b.respTopc, Payload: []byte(okResp),
		Properties: &paho.PublishProperties{CorrelationData: []byte("0123456789abcdef"),
			User: paho.UserProperties{{Key: wire.PropStatus, Value: wire.StatusOK}}}})
	if err == nil || pr == nil || pr.ReasonCode != reasonNotAuthorized {
		t.Errorf("alice's PUBLISH on bob's response topic: %v (%+v), want PUBACK 0x87", err, pr)
	}
	req := &paho.Publish{QoS: 1, Topic: wire.InvokeTopic, Payload: cmd("GET", "a/k").payload,
		Properties: &paho.PublishProperties{ResponseTopic: b.respTopc, CorrelationData: []byte("fedcba9876543210"),
			User: paho.UserProperties{{Key: wire.PropTimestamp, Value: a.clock.Now().String()}}}}
	pr, err = a.c.Publish(ctx, req)
	if err == nil || pr == nil || pr.ReasonCode != reasonNotAuthorized {
		t.Errorf("alice's request answered on bob's response topic: %v (%+v), want PUBACK 0x87", err, pr)
	}
	if n := srv.Requests(a.id); n != 1 {
		t.Errorf("store counted %d requests from alice, want 1 (refused, not executed)", n)
	}

	mustPayload(t, b.do(cmd("GET", "b/k")), nullResp)
	b.noMessage() // nothing but his own responses reached bob
	mustPayload(t, a.do(cmd("GET", "a/k")), nullResp)
}

// TestNoRetainedUnderClients: a retained message under clients/ is refused,
// even in the publisher's own namespace, so nothing there is ever delivered
// again to a later subscriber; elsewhere retained messages work as usual.
func TestNoRetainedUnderClients(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, qos := range []byte{1, 2} {
		pr, err := a.c.Publish(ctx, &paho.Publish{QoS: qos, Retain: true, Topic: a.respTopc, Payload: []byte(okResp)})
		if pr == nil || pr.ReasonCode != reasonNotAuthorized {
			t.Errorf("retained PUBLISH at QoS %d under clients/: %v (%+v), want reason 0x87", qos, err, pr)
		}
	}
	if _, err := a.c.Publish(ctx, &paho.Publish{QoS: 1, Retain: true, Topic: "news/today", Payload: []byte("sun")}); err != nil {
		t.Fatal(err)
	}
	b := connect(t, srv)
	b.subscribe("news/today")
	if p := b.next(); string(p.Payload) != "sun" {
		t.Fatalf("retained message %q", p.Payload)
	}
	a.subscribe("clients/" + a.id + "/#")
	a.do(cmd("GET", "k"))
	a.noMessage()
}

// connectReason connects with o and returns the CONNACK's reason code; a
// client that connected is closed when the test ends.
func connectReason(t testing.TB, srv *localstore.Server, o connOpts) byte {
	t.Helper()
	_, err := dial(t, srv, o)
	if err == nil {
		return 0
	}
	var code byte
	i := strings.LastIndex(err.Error(), "(reason 0x")
	if i < 0 {
		t.Fatalf("connect %s: %v", o.id, err)
	}
	if _, scanErr := fmt.Sscanf(err.Error()[i:], "(reason 0x%02x)", &code); scanErr != nil {
		t.Fatalf("connect %s: %v", o.id, err)
	}
	return code
}

// TestTenantClientIDTakeover (issue 16, item 4): while a client id is
// connected, another user's CONNECT with it is refused and does not disturb
// it. Once it is not, another user may use it (credentials may change, as a
// rotated token's can), but inherits nothing the session held for the
// previous user: no waiting message, no subscription it could not make.
func TestTenantClientIDTakeover(t *testing.T) {
	srv := startTenants(t)
	withSession := as(bob, "bob-1")
	withSession.expiry = 3600
	b := connect(t, srv, withSession)
	if code := connectReason(t, srv, as(alice, "bob-1")); code != reasonNotAuthorized {
		t.Fatalf("alice connecting as bob-1: CONNACK 0x%02x, want 0x87", code)
	}
	mustPayload(t, b.do(cmd("GET", "b/k")), nullResp) // bob's connection, unharmed
	select {
	case d := <-b.gone:
		t.Fatalf("bob disconnected: 0x%02x", d.ReasonCode)
	default:
	}

	// bob-1 shares the work on clients/bob-2/x with bob-3, then is cut off,
	// its session kept; bob-2 answers it, into that session.
	b2, b3 := connect(t, srv, as(bob, "bob-2")), connect(t, srv, as(bob, "bob-3"))
	shared := "$share/work/clients/bob-2/x"
	b.subscribe(shared)
	b3.subscribe(shared)
	if err := srv.Kick("bob-1"); err != nil { // returns once the store is done with the connection
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := b2.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: b.respTopc, Payload: []byte("for bob only"),
		Properties: &paho.PublishProperties{CorrelationData: []byte("x")}}); err != nil {
		t.Fatalf("bob-2 answering bob-1: %v", err)
	}

	// alice resumes "bob-1" while it is away.
	rc, ca := connectRaw(t, srv, &packets.Connect{ClientID: "bob-1", KeepAlive: 30, UsernameFlag: true, Username: alice.username,
		PasswordFlag: true, Password: []byte(alice.password)})
	if ca.ReasonCode != 0 {
		t.Fatalf("alice connecting as bob-1 while it is away: CONNACK 0x%02x", ca.ReasonCode)
	}
	respTopic := "clients/bob-1/services/statestore/_any_/command/invoke/response"
	rc.write(&packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: respTopic, QoS: 1}},
		Properties: &packets.Properties{}})
	rc.write(rc.request(7, respTopic, "GET", "a/k"))
	for { // everything that comes before her answer
		p, ok := rc.read().Content.(*packets.Publish)
		if !ok {
			continue
		}
		if string(p.Payload) == "for bob only" {
			t.Fatal("alice got what was waiting in bob's session")
		}
		if p.Topic == respTopic {
			break
		}
	}
	// bob-1's share of bob's work did not pass to alice: bob-3 gets it all.
	const n = 20
	for i := range n {
		if _, err := b2.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: "clients/bob-2/x", Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		if p := b3.next(); string(p.Payload) != fmt.Sprint(i) {
			t.Fatalf("bob-3's message %d: %q", i, p.Payload)
		}
	}

	// Now bob-1 is alice's while she is connected; bob gets it back after.
	if code := connectReason(t, srv, as(bob, "bob-1")); code != reasonNotAuthorized {
		t.Fatalf("bob connecting as bob-1 while alice is: CONNACK 0x%02x, want 0x87", code)
	}
	if err := srv.Kick("bob-1"); err != nil {
		t.Fatal(err)
	}
	b = connect(t, srv, as(bob, "bob-1"))
	mustPayload(t, b.do(cmd("GET", "b/k")), nullResp)

	// "41" is the upper-case hex of "A": their namespaces overlap
	// (clients/41/...), so while one is connected the other is its user's.
	connect(t, srv, as(bob, "A"))
	if code := connectReason(t, srv, as(alice, "41")); code != reasonNotAuthorized {
		t.Fatalf("alice connecting as 41 (the hex of bob's A): CONNACK 0x%02x, want 0x87", code)
	}
}

// TestTenantWatchGroup (issue 16, item 5): nobody joins the shared group
// through which the store delivers notifications, so a watcher that does not
// subscribe to its notification topic (like the official Go SDK) gets every
// notification.
func TestTenantWatchGroup(t *testing.T) {
	srv := startTenants(t)
	b := connect(t, srv, bob) // never subscribes to its notification topic
	a := connect(t, srv, alice)
	mustPayload(t, b.do(cmd("KEYNOTIFY", "b/k")), okResp)
	mustPayload(t, a.do(cmd("KEYNOTIFY", "a/k")), okResp)
	for _, f := range []string{
		watchGroup + wire.NotifyTopic(b.id, []byte("b/k")), watchGroup + "#",
		watchGroup + wire.NotifyTopic(a.id, []byte("a/k")), // her own: the group is still the store's
		"$SHARE/dsslock-localstore-watch/" + wire.NotifyFilter(b.id),
	} {
		if code := subReason(t, a, f); code != reasonNotAuthorized {
			t.Errorf("alice's subscription to %q: SUBACK 0x%02x, want 0x87", f, code)
		}
	}
	const n = 100
	for i := range n {
		mustPayload(t, b.do(cmd("SET", "b/k", fmt.Sprint(i))), okResp)
	}
	for i := range n {
		if p := b.next(); string(p.Payload) != string(notifySet(fmt.Sprint(i))) {
			t.Fatalf("notification %d: %q", i, p.Payload)
		}
	}
}

// TestStartRefusesUnverifiedUsers (issue 16, item 6): KeyPrefixes for named
// users need a way to verify them.
func TestStartRefusesUnverifiedUsers(t *testing.T) {
	prefixes := map[string][]string{"alice": {"a/"}, "bob": {"b/"}}
	cert, _ := selfSigned(t)
	for _, cfg := range []localstore.Config{
		{KeyPrefixes: prefixes},
		{KeyPrefixes: prefixes, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}},
		{KeyPrefixes: prefixes, TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert}},
	} {
		if srv, err := localstore.Start(cfg); err == nil {
			_ = srv.Close()
			t.Errorf("Start with KeyPrefixes for unverifiable users (TLS %v): no error", cfg.TLS != nil)
		} else if !strings.Contains(err.Error(), `"alice" "bob"`) {
			t.Errorf("Start: %v; want the users named", err)
		}
	}
	for _, cfg := range []localstore.Config{
		{KeyPrefixes: map[string][]string{"": {"app/"}}}, // anonymous clients only
		{KeyPrefixes: prefixes, Users: map[string]string{"alice": "x"}},
		{KeyPrefixes: prefixes, SATTokens: map[string]string{"t": "bob"}},
		{KeyPrefixes: prefixes, TLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven}},
	} {
		srv, err := localstore.Start(cfg)
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		_ = srv.Close()
	}
}

// TestUserFromCertificate (issue 16, item 6): with client certificates as
// the only authentication, the user is the certificate's Subject
// CommonName, whatever user name CONNECT claims; a client without one is
// anonymous.
func TestUserFromCertificate(t *testing.T) {
	serverCert, serverPool := selfSigned(t)
	ca := newTestCA(t)
	srv := startStore(t, localstore.Config{
		TLS:         &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven},
		KeyPrefixes: map[string][]string{"alice": {"a/"}, "bob": {"b/"}, "": {"pub/"}},
	})
	tlsAs := func(cn string) connOpts {
		cfg := &tls.Config{RootCAs: serverPool, ServerName: "localhost"}
		if cn != "" {
			cfg.Certificates = []tls.Certificate{ca.issue(t, cn)}
		}
		return connOpts{addr: srv.TLSAddr(), tlsConfig: cfg, username: "bob", password: "anything"}
	}
	b := connect(t, srv, tlsAs("bob"))
	mustPayload(t, b.do(cmd("SET", "b/secret", "s3cret")), okResp)

	for name, o := range map[string]connOpts{
		"alice's certificate": tlsAs("alice"),
		"no certificate":      tlsAs(""),
		"plain TCP":           {username: "bob", password: "anything"},
	} {
		c := connect(t, srv, o) // CONNECT says "bob" every time
		mustPayload(t, c.do(cmd("GET", "b/secret")), errPayload(wire.MsgNotAuthorized))
		want := okResp
		if name == "alice's certificate" {
			mustPayload(t, c.do(cmd("SET", "a/k", "v")), want)
		} else {
			mustPayload(t, c.do(cmd("SET", "pub/k", "v")), want)
		}
	}
	if _, err := dial(t, srv, tlsAs("")); err != nil {
		t.Fatalf("anonymous TLS client refused: %v", err)
	}
	if code := connectReason(t, srv, connOpts{addr: srv.TLSAddr(), tlsConfig: &tls.Config{RootCAs: serverPool, ServerName: "localhost",
		Certificates: []tls.Certificate{ca.issue(t, "")}}}); code == 0 {
		t.Fatal("client certificate without a CommonName accepted")
	}
}

// testCA issues client certificates.
type testCA struct{ *testtls.CA }

func newTestCA(t testing.TB) testCA {
	t.Helper()
	ca, err := testtls.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	return testCA{ca}
}

// issue returns a client certificate with Subject CommonName cn.
func (ca testCA) issue(t testing.TB, cn string) tls.Certificate {
	t.Helper()
	c, err := ca.Issue(cn, false)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNoAuthClientsShareANamespace: without authentication every client is
// the one anonymous user, and the store is the ordinary broker it always
// was between them: one answers another's request on its response topic
// (the official SDKs' RPC), or follows its responses. Only the store's
// notifications stay each client's own.
func TestNoAuthClientsShareANamespace(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	invoker, executor, spy := connect(t, srv), connect(t, srv), connect(t, srv)
	spy.subscribe("clients/" + invoker.id + "/#")
	if code := subReason(t, spy, wire.NotifyFilter(invoker.id)); code != reasonNotAuthorized {
		t.Fatalf("subscription to another client's notifications: SUBACK 0x%02x, want 0x87", code)
	}
	ch := make(chan *paho.Publish, 1)
	invoker.mu.Lock()
	invoker.pending["rpc-1"] = ch
	invoker.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := executor.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: invoker.respTopc, Payload: []byte("hello"),
		Properties: &paho.PublishProperties{CorrelationData: []byte("rpc-1")}}); err != nil {
		t.Fatalf("executor answering on the invoker's response topic: %v", err)
	}
	select {
	case p := <-ch:
		if string(p.Payload) != "hello" {
			t.Fatalf("invoker got %q", p.Payload)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the invoker got no answer")
	}
	if p := spy.next(); p.Topic != invoker.respTopc {
		t.Fatalf("spy got %q", p.Topic)
	}
}
