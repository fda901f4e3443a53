package localstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// waitTimeout bounds every wait for a message in these tests. It is generous:
// a test that fails waits this long, a test that passes never does.
const waitTimeout = 10 * time.Second

// startStore starts a local store for one test and closes it at the end.
func startStore(t testing.TB, cfg localstore.Config) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// rawClient is a plain paho.golang MQTT v5 client, to talk to the store the
// way any client would: nothing of dsslock's client is used.
type rawClient struct {
	t        testing.TB
	id       string
	c        *paho.Client
	clock    *hlc.Clock
	respTopc string

	mu      sync.Mutex
	pending map[string]chan *paho.Publish
	other   chan *paho.Publish // everything that is not a response
	gone    chan *paho.Disconnect
}

type connOpts struct {
	id        string
	username  string
	password  string
	satToken  string
	tlsConfig *tls.Config
	addr      string
	expiry    uint32
	noCleanup bool
}

func dial(t testing.TB, srv *localstore.Server, o connOpts) (*rawClient, error) {
	t.Helper()
	if o.id == "" {
		o.id = fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), clientSeq.Add(1))
	}
	addr := o.addr
	if addr == "" {
		addr = srv.Addr()
	}
	var conn net.Conn
	var err error
	if o.tlsConfig != nil {
		conn, err = tls.Dial("tcp", addr, o.tlsConfig)
	} else {
		conn, err = net.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	clock, err := hlc.NewClock(o.id)
	if err != nil {
		t.Fatal(err)
	}
	rc := &rawClient{
		t:        t,
		id:       o.id,
		clock:    clock,
		respTopc: "clients/" + o.id + "/services/statestore/_any_/command/invoke/response",
		pending:  make(map[string]chan *paho.Publish),
		other:    make(chan *paho.Publish, 1024),
		gone:     make(chan *paho.Disconnect, 1),
	}
	cfg := paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn), // paho writes from several goroutines; tls.Conn needs the lock
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			rc.route(pr.Packet)
			return true, nil
		}},
		OnServerDisconnect: func(d *paho.Disconnect) {
			select {
			case rc.gone <- d:
			default:
			}
		},
	}
	if o.satToken != "" {
		cfg.AuthHandler = nopAuth{}
	}
	rc.c = paho.NewClient(cfg)
	rm := uint16(65535) // stated, as the official SDKs do: it turns on the broker's flow control
	cp := &paho.Connect{ClientID: o.id, KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &o.expiry, ReceiveMaximum: &rm}}
	if o.username != "" {
		cp.Username, cp.UsernameFlag = o.username, true
		cp.Password, cp.PasswordFlag = []byte(o.password), true
	}
	if o.satToken != "" {
		cp.Properties.AuthMethod = "K8S-SAT"
		cp.Properties.AuthData = []byte(o.satToken)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ca, err := rc.c.Connect(ctx, cp)
	if err != nil {
		if ca != nil {
			return nil, fmt.Errorf("connect: %w (reason 0x%02x)", err, ca.ReasonCode)
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	if !o.noCleanup {
		t.Cleanup(rc.close)
	}
	if _, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: rc.respTopc, QoS: 1}}}); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	return rc, nil
}

var clientSeq atomic.Int64

type nopAuth struct{}

func (nopAuth) Authenticate(*paho.Auth) *paho.Auth { return &paho.Auth{} }
func (nopAuth) Authenticated()                     {}

// connect dials and fails the test on error.
func connect(t testing.TB, srv *localstore.Server, o ...connOpts) *rawClient {
	t.Helper()
	var opts connOpts
	if len(o) > 0 {
		opts = o[0]
	}
	rc, err := dial(t, srv, opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return rc
}

func (rc *rawClient) close() {
	_ = rc.c.Disconnect(&paho.Disconnect{})
	<-rc.c.Done()
}

func (rc *rawClient) route(p *paho.Publish) {
	if p.Properties != nil && p.Topic == rc.respTopc {
		rc.mu.Lock()
		ch := rc.pending[string(p.Properties.CorrelationData)]
		delete(rc.pending, string(p.Properties.CorrelationData))
		rc.mu.Unlock()
		if ch != nil {
			ch <- p
			return
		}
	}
	select {
	case rc.other <- p:
	default:
		rc.t.Errorf("%s: message buffer full, dropped %q", rc.id, p.Topic)
	}
}

// request is one raw request: payload plus user properties.
type request struct {
	payload  []byte
	props    map[string]string // user properties; "__ts" is added unless noTS
	noTS     bool
	qos      byte
	noCorr   bool
	corr     []byte // the correlation data; random if nil
	respTopc *string
}

// cmd builds a request from RESP arguments, stamped with the client's clock.
func cmd(args ...string) request {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	return request{payload: resp.AppendCommand(nil, b...), qos: 1}
}

func (r request) with(k, v string) request {
	p := map[string]string{}
	for kk, vv := range r.props {
		p[kk] = vv
	}
	p[k] = v
	r.props = p
	return r
}

func (r request) withoutTS() request { r.noTS = true; return r }

// response is a decoded response.
type response struct {
	pub     *paho.Publish
	payload string
	props   map[string]string
}

func (r response) ts() (hlc.Timestamp, bool) {
	v, ok := r.props[wire.PropTimestamp]
	if !ok {
		return hlc.Timestamp{}, false
	}
	ts, err := hlc.Parse(v)
	if err != nil {
		panic(err)
	}
	return ts, true
}

// send publishes r and returns the channel its response arrives on.
func (rc *rawClient) send(r request) (<-chan *paho.Publish, []byte) {
	rc.t.Helper()
	corr := r.corr
	if corr == nil {
		corr = make([]byte, 16)
		_, _ = rand.Read(corr)
	}
	props := &paho.PublishProperties{ResponseTopic: rc.respTopc, ContentType: wire.ContentType}
	if r.respTopc != nil {
		props.ResponseTopic = *r.respTopc
	}
	if !r.noCorr {
		props.CorrelationData = corr
	}
	if !r.noTS {
		props.User.Add(wire.PropTimestamp, rc.clock.Now().String())
	}
	for k, v := range r.props {
		props.User.Add(k, v)
	}
	ch := make(chan *paho.Publish, 1)
	rc.mu.Lock()
	rc.pending[string(props.CorrelationData)] = ch
	rc.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := rc.c.Publish(ctx, &paho.Publish{QoS: r.qos, Topic: wire.InvokeTopic, Payload: r.payload, Properties: props}); err != nil {
		rc.t.Fatalf("%s: publish: %v", rc.id, err)
	}
	return ch, props.CorrelationData
}

// do sends r and waits for its response.
func (rc *rawClient) do(r request) response {
	rc.t.Helper()
	ch, corr := rc.send(r)
	return rc.await(ch, corr)
}

func (rc *rawClient) await(ch <-chan *paho.Publish, corr []byte) response {
	rc.t.Helper()
	select {
	case p := <-ch:
		if !bytes.Equal(p.Properties.CorrelationData, corr) {
			rc.t.Fatalf("correlation data %x, want %x", p.Properties.CorrelationData, corr)
		}
		return decode(p)
	case <-time.After(waitTimeout):
		rc.t.Fatalf("%s: no response within %v", rc.id, waitTimeout)
		return response{}
	}
}

func decode(p *paho.Publish) response {
	r := response{pub: p, payload: string(p.Payload), props: map[string]string{}}
	if p.Properties != nil {
		for _, u := range p.Properties.User {
			r.props[u.Key] = u.Value
		}
	}
	return r
}

// next returns the next message that is not a response.
func (rc *rawClient) next() *paho.Publish {
	rc.t.Helper()
	select {
	case p := <-rc.other:
		return p
	case <-time.After(waitTimeout):
		rc.t.Fatalf("%s: no message within %v", rc.id, waitTimeout)
		return nil
	}
}

// noMessage fails if a message that is not a response is waiting.
func (rc *rawClient) noMessage() {
	rc.t.Helper()
	select {
	case p := <-rc.other:
		rc.t.Fatalf("%s: unexpected message on %q: %q", rc.id, p.Topic, p.Payload)
	default:
	}
}

func (rc *rawClient) subscribe(filter string) {
	rc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil {
		rc.t.Fatalf("subscribe %q: %v", filter, err)
	}
	if sa.Reasons[0] > 2 {
		rc.t.Fatalf("subscribe %q: reason 0x%02x", filter, sa.Reasons[0])
	}
}

// mustOK asserts a +OK response.
func mustPayload(t testing.TB, r response, want string) {
	t.Helper()
	if r.payload != want {
		t.Fatalf("payload %q, want %q", r.payload, want)
	}
}

func errPayload(msg string) string { return "-ERR " + msg + "\r\n" }
