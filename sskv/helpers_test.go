package sskv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// waitTimeout bounds every wait in these tests: a failing test waits this
// long, a passing one never does.
const waitTimeout = 10 * time.Second

var seq atomic.Int64

// testID returns a client id unique to this test run.
func testID(t testing.TB) string {
	r := strings.NewReplacer("/", "-", ":", "-", " ", "_", "#", "-", "+", "-")
	return fmt.Sprintf("%s-%d", r.Replace(t.Name()), seq.Add(1))
}

func startStore(t testing.TB, cfg localstore.Config) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(cfg)
	if err != nil {
		t.Fatalf("localstore.Start: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// dial connects a client to srv with fast reconnects; mod adjusts the config.
func dial(t testing.TB, srv *localstore.Server, mod ...func(*sskv.Config)) *sskv.Client {
	t.Helper()
	c, err := tryDial(t, srv, mod...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return c
}

func tryDial(t testing.TB, srv *localstore.Server, mod ...func(*sskv.Config)) (*sskv.Client, error) {
	cfg := sskv.Config{
		Addr:         srv.Addr(),
		ClientID:     testID(t),
		ReconnectMin: 10 * time.Millisecond,
		ReconnectMax: 100 * time.Millisecond,
	}
	for _, m := range mod {
		m(&cfg)
	}
	c, err := sskv.Dial(testCtx(t), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, nil
}

// fakeService is a raw paho client that plays the state store on its own
// topic: the client under test is pointed at it with SetInvokeTopicForTest.
type fakeService struct {
	t     testing.TB
	c     *paho.Client
	topic string
	reqs  chan *paho.Publish
}

func startFake(t testing.TB, srv *localstore.Server) *fakeService {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeService{t: t, topic: "test/fake-statestore/" + testID(t), reqs: make(chan *paho.Publish, 1024)}
	f.c = paho.NewClient(paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn), // paho writes from several goroutines
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			f.reqs <- pr.Packet
			return true, nil
		}},
	})
	ctx := testCtx(t)
	if _, err := f.c.Connect(ctx, &paho.Connect{ClientID: testID(t), KeepAlive: 30, CleanStart: true}); err != nil {
		t.Fatalf("fake connect: %v", err)
	}
	t.Cleanup(func() {
		_ = f.c.Disconnect(&paho.Disconnect{})
		<-f.c.Done()
	})
	if _, err := f.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: f.topic, QoS: 1}}}); err != nil {
		t.Fatalf("fake subscribe: %v", err)
	}
	return f
}

// attach points c at the fake service.
func (f *fakeService) attach(c *sskv.Client) { sskv.SetInvokeTopicForTest(c, f.topic) }

// next returns the next request the fake service received.
func (f *fakeService) next() *paho.Publish {
	f.t.Helper()
	select {
	case p := <-f.reqs:
		return p
	case <-time.After(waitTimeout):
		f.t.Fatal("fake service: no request")
		return nil
	}
}

// respond answers req with payload and user properties (in order, as pairs).
func (f *fakeService) respond(req *paho.Publish, payload string, props ...string) {
	f.t.Helper()
	var user paho.UserProperties
	for i := 0; i+1 < len(props); i += 2 {
		user = append(user, paho.UserProperty{Key: props[i], Value: props[i+1]})
	}
	_, err := f.c.Publish(testCtx(f.t), &paho.Publish{QoS: 1, Topic: req.Properties.ResponseTopic, Payload: []byte(payload),
		Properties: &paho.PublishProperties{CorrelationData: req.Properties.CorrelationData, User: user}})
	if err != nil {
		f.t.Fatalf("fake respond: %v", err)
	}
}

// nextEvent returns w's next event.
func nextEvent(t testing.TB, w *sskv.Watcher) sskv.Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("watcher of %q ended: %v", w.Key(), w.Err())
		}
		return ev
	case <-time.After(waitTimeout):
		t.Fatalf("no event for %q", w.Key())
		return sskv.Event{}
	}
}

// wantInitial returns w's first event, failing unless it is the Initial
// event carrying the state op and value (a missing key has no version).
func wantInitial(t testing.TB, w *sskv.Watcher, op sskv.Op, value string) sskv.Event {
	t.Helper()
	ev := nextEvent(t, w)
	checkInitial(t, ev, w.Key(), op, value)
	return ev
}

// checkInitial fails unless ev is the Initial event of key carrying the
// state op and value.
func checkInitial(t testing.TB, ev sskv.Event, key string, op sskv.Op, value string) {
	t.Helper()
	if !ev.Initial || ev.Resync || ev.Key != key || ev.Op != op || string(ev.Value) != value {
		t.Fatalf("first event %+v; want Initial %v %q of %q", ev, op, value, key)
	}
	if op == sskv.OpDelete && (ev.Value != nil || !ev.Version.IsZero()) {
		t.Fatalf("Initial event of a missing key %+v; want no value and a zero version", ev)
	}
	if op == sskv.OpSet && ev.Version.IsZero() {
		t.Fatalf("Initial event %+v has no version", ev)
	}
}

// noEvent fails if w has an event ready now.
func noEvent(t testing.TB, w *sskv.Watcher) {
	t.Helper()
	select {
	case ev := <-w.Events():
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
}

// eventually polls cond (a condition, not a delay) until it holds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// selfSigned makes a certificate for localhost/127.0.0.1, a pool that
// trusts it, and its DER bytes.
func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool, []byte) {
	t.Helper()
	cert, pool, err := testtls.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	return cert, pool, cert.Certificate[0]
}

func x509MarshalKey(cert tls.Certificate) ([]byte, error) {
	return x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
}

// loudLogs counts log records above Debug: a quiet path must log none.
type loudLogs struct{ n atomic.Int64 }

func (h *loudLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *loudLogs) Handle(_ context.Context, r slog.Record) error {
	if r.Level > slog.LevelDebug {
		h.n.Add(1)
	}
	return nil
}
func (h *loudLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *loudLogs) WithGroup(string) slog.Handler      { return h }
