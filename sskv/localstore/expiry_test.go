package localstore

import (
	"context"
	"crypto/rand"
	"net"
	"sync"
	"testing"
	"time"

	mqttpackets "github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// expiryWait bounds every wait of these tests: a failing test waits this
// long, a passing one never does.
const expiryWait = 10 * time.Second

// pahoClient is a plain paho.golang MQTT v5 client that sends state store
// requests with a Message Expiry of its choosing.
type pahoClient struct {
	t     *testing.T
	id    string
	c     *paho.Client
	clock *hlc.Clock
	topic string

	mu      sync.Mutex
	pending map[string]chan *paho.Publish
}

func dialPaho(t *testing.T, srv *Server, id string) *pahoClient {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	clock, _ := hlc.NewClock(id)
	pc := &pahoClient{t: t, id: id, clock: clock, topic: id + "/response", pending: make(map[string]chan *paho.Publish)}
	pc.c = paho.NewClient(paho.ClientConfig{
		Conn: mqttpackets.NewThreadSafeConn(conn),
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			pc.mu.Lock()
			ch := pc.pending[string(pr.Packet.Properties.CorrelationData)]
			delete(pc.pending, string(pr.Packet.Properties.CorrelationData))
			pc.mu.Unlock()
			if ch != nil {
				ch <- pr.Packet
			}
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), expiryWait)
	defer cancel()
	if _, err := pc.c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.c.Disconnect(&paho.Disconnect{}); <-pc.c.Done() })
	if _, err := pc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: pc.topic, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	return pc
}

// sent is a request on its way: its PUBACK's reason code, once the broker
// acknowledged it, and its response, if one comes.
type sent struct {
	puback   chan byte
	response chan *paho.Publish
}

// send publishes a request with a Message Expiry of expiry seconds (0:
// none). It does not wait for the PUBACK, which comes only once the store
// has handled the request.
func (pc *pahoClient) send(expiry uint32, args ...string) sent {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	corr := make([]byte, 16)
	_, _ = rand.Read(corr)
	props := &paho.PublishProperties{ResponseTopic: pc.topic, CorrelationData: corr,
		User: paho.UserProperties{{Key: wire.PropTimestamp, Value: pc.clock.Now().String()}}}
	if expiry > 0 {
		props.MessageExpiry = &expiry
	}
	s := sent{puback: make(chan byte, 1), response: make(chan *paho.Publish, 1)}
	pc.mu.Lock()
	pc.pending[string(corr)] = s.response
	pc.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), expiryWait)
		defer cancel()
		pr, err := pc.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: wire.InvokeTopic, Payload: resp.AppendCommand(nil, b...), Properties: props})
		if err != nil {
			pc.t.Errorf("%s: publish: %v", pc.id, err)
			close(s.puback)
			return
		}
		s.puback <- pr.ReasonCode
	}()
	return s
}

// answer waits for the response to s, and for its PUBACK, so that no
// Publish is left running.
func (pc *pahoClient) answer(s sent) string {
	pc.t.Helper()
	select {
	case p := <-s.response:
		pc.acked(s)
		return string(p.Payload)
	case <-time.After(expiryWait):
		pc.t.Fatalf("%s: no response within %v", pc.id, expiryWait)
		return ""
	}
}

// acked waits for the PUBACK of s and returns its reason code.
func (pc *pahoClient) acked(s sent) byte {
	pc.t.Helper()
	select {
	case code, ok := <-s.puback:
		if !ok {
			pc.t.FailNow()
		}
		return code
	case <-time.After(expiryWait):
		pc.t.Fatalf("%s: no PUBACK within %v", pc.id, expiryWait)
		return 0
	}
}

// awaitRequests waits until the store has read n requests from each of the
// clients: they are then waiting for its lock. There is no event to wait on.
func awaitRequests(t *testing.T, srv *Server, n int64, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(expiryWait)
	for _, id := range ids {
		for srv.Requests(id) < n {
			if time.Now().After(deadline) {
				t.Fatalf("the store read %d requests from %s, want %d", srv.Requests(id), id, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestExpiredRequestNotExecuted: a request whose Message Expiry Interval
// (1 s) passes while it waits for the store's lock is dropped: the key is
// unchanged and no response comes, though its PUBACK is a success as for
// any request. Requests that waited as long with a longer expiry, or none,
// are executed. The store used to execute a request however long it had
// waited, against MQTT's rule that an expired message is not delivered.
func TestExpiredRequestNotExecuted(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	short, long, none := dialPaho(t, srv, "short"), dialPaho(t, srv, "long"), dialPaho(t, srv, "none")
	before := short.send(1, "SET", "k", "before")
	if got := short.answer(before); got != "+OK\r\n" {
		t.Fatalf("SET before the wait: %q", got)
	}

	srv.mu.Lock()
	locked := true
	defer func() {
		if locked {
			srv.mu.Unlock()
		}
	}()
	expired := short.send(1, "SET", "k", "expired")
	longer := long.send(60, "SET", "long", "v")
	never := none.send(0, "SET", "none", "v")
	awaitRequests(t, srv, 2, "short")
	awaitRequests(t, srv, 1, "long", "none")
	read := time.Now() // every request was read before this
	// The wait under test: the lock is held until the 1 s expiry of the
	// request read first has passed, counted from its receipt.
	time.Sleep(time.Until(read.Add(time.Second + 100*time.Millisecond)))
	srv.mu.Unlock()
	locked = false

	if got := long.answer(longer); got != "+OK\r\n" {
		t.Errorf("request with a 60 s expiry: %q, want +OK", got)
	}
	if got := none.answer(never); got != "+OK\r\n" {
		t.Errorf("request without expiry: %q, want +OK", got)
	}
	if code := short.acked(expired); code != 0 {
		t.Errorf("expired request: PUBACK 0x%02x, want 0x00 (success) as for any request", code)
	}
	// Responses to one connection come in order: had the expired SET been
	// answered, its response would have come before this GET's.
	get := short.send(0, "GET", "k")
	if got := short.answer(get); got != "$6\r\nbefore\r\n" {
		t.Errorf("GET after the expired SET: %q, want the value before it", got)
	}
	select {
	case p := <-expired.response:
		t.Errorf("the expired request was answered: %q", p.Payload)
	default:
	}
}

// TestHeldRequestNotExpired: a request's expiry counts from the moment the
// broker reads it. One that Hold kept from the store for longer than its
// expiry, as a network path that froze would, is executed once released.
func TestHeldRequestNotExpired(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	pc := dialPaho(t, srv, "held")
	if err := srv.Hold("held", ToStore); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s := pc.send(1, "SET", "k", "v")
	time.Sleep(time.Until(start.Add(time.Second + 100*time.Millisecond))) // the hold under test, past the expiry
	srv.Release("held")
	if got := pc.answer(s); got != "+OK\r\n" {
		t.Fatalf("held request: %q, want +OK", got)
	}
}

// TestSSKVRequestsNotExpired: an sskv client's requests are never dropped
// as expired, even with 1 s Message Expiry (a context of under a second)
// and a wait for the store's lock: sskv tells the store the time left
// before the request's deadline, rounded up, and the store counts from its
// receipt of the request, not in whole seconds.
func TestSSKVRequestsNotExpired(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), expiryWait)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "sskv-expiry"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, err := c.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := <-w.Events(); !ev.Initial || ev.Op != sskv.OpDelete {
		t.Fatalf("first event %+v; want Initial DELETE (the key is missing)", ev)
	}

	for i := range 20 {
		// Every other request waits 300 ms for the lock.
		hold := i%2 == 1
		if hold {
			srv.mu.Lock()
		}
		reqCtx, cancel := context.WithTimeout(ctx, 900*time.Millisecond) // Message Expiry 1 s
		done := make(chan error, 1)
		n := srv.Requests("sskv-expiry")
		go func() {
			_, err := c.Set(reqCtx, "k", []byte{byte('a' + i)}, sskv.SetOptions{})
			done <- err
		}()
		if hold {
			awaitRequests(t, srv, n+1, "sskv-expiry")
			time.Sleep(300 * time.Millisecond) // the wait under test
			srv.mu.Unlock()
		}
		err := <-done
		cancel()
		if err != nil {
			t.Errorf("SET %d (waited for the lock: %v): %v", i, hold, err)
			continue
		}
		select {
		case ev := <-w.Events():
			if string(ev.Value) != string([]byte{byte('a' + i)}) {
				t.Errorf("event %d: %q", i, ev.Value)
			}
		case <-time.After(expiryWait):
			t.Fatalf("no notification of SET %d", i)
		}
	}
	getCtx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	if g, err := c.Get(getCtx, "k"); err != nil || string(g.Value) != "t" {
		t.Fatalf("GET: %+v, %v", g, err)
	}
}
