// Package rawmqtt is a minimal MQTT v5 request/response client on plain
// paho.golang, with none of dsslock's code in the path. Benchmarks use it as
// the baseline the state store is measured against: the same broker, the
// same transport, QoS 1, but no state store.
package rawmqtt

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"sync"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
)

// Client is one MQTT v5 connection that can make requests: it publishes at
// QoS 1 with a response topic and correlation data and waits for the message
// that comes back on its response topic with the same correlation data.
type Client struct {
	c        *paho.Client
	id       string
	respTopc string

	mu      sync.Mutex
	pending map[[16]byte]chan *paho.Publish
}

// Dial connects a client with the given id to the broker at addr and
// subscribes it to its response topic.
func Dial(ctx context.Context, addr, id string) (*Client, error) {
	return dial(ctx, addr, id, nil)
}

func dial(ctx context.Context, addr, id string, handler func(*Client, *paho.Publish)) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	rc := &Client{id: id, respTopc: "rawmqtt/" + id + "/response", pending: make(map[[16]byte]chan *paho.Publish)}
	rc.c = paho.NewClient(paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn), // paho writes from several goroutines
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			if handler != nil {
				handler(rc, pr.Packet)
			} else {
				rc.deliver(pr.Packet)
			}
			return true, nil
		}},
	})
	if _, err := rc.c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 60, CleanStart: true}); err != nil {
		return nil, fmt.Errorf("rawmqtt: connect: %w", err)
	}
	if err := rc.Subscribe(ctx, rc.respTopc); err != nil {
		rc.Close()
		return nil, err
	}
	return rc, nil
}

// ResponseTopic is the topic this client receives responses on. A request
// published to it comes straight back: the shortest QoS 1 round trip through
// the broker.
func (rc *Client) ResponseTopic() string { return rc.respTopc }

// Subscribe subscribes at QoS 1 and waits for the SUBACK.
func (rc *Client) Subscribe(ctx context.Context, filter string) error {
	sa, err := rc.c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err != nil {
		return fmt.Errorf("rawmqtt: subscribe: %w", err)
	}
	if len(sa.Reasons) != 1 || sa.Reasons[0] > 2 {
		return fmt.Errorf("rawmqtt: subscribe %q refused: %v", filter, sa.Reasons)
	}
	return nil
}

// Request publishes payload to topic at QoS 1 with the given user
// properties, and returns the response.
func (rc *Client) Request(ctx context.Context, topic string, payload []byte, user paho.UserProperties) (*paho.Publish, error) {
	var corr [16]byte
	_, _ = rand.Read(corr[:])
	ch := make(chan *paho.Publish, 1)
	rc.mu.Lock()
	rc.pending[corr] = ch
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		delete(rc.pending, corr)
		rc.mu.Unlock()
	}()
	_, err := rc.c.Publish(ctx, &paho.Publish{QoS: 1, Topic: topic, Payload: payload,
		Properties: &paho.PublishProperties{ResponseTopic: rc.respTopc, CorrelationData: corr[:], User: user}})
	if err != nil {
		return nil, err
	}
	select {
	case p := <-ch:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (rc *Client) deliver(p *paho.Publish) {
	if p.Properties == nil || len(p.Properties.CorrelationData) != 16 {
		return
	}
	var corr [16]byte
	copy(corr[:], p.Properties.CorrelationData)
	rc.mu.Lock()
	ch := rc.pending[corr]
	rc.mu.Unlock()
	if ch != nil {
		select {
		case ch <- p:
		default:
		}
	}
}

// Close disconnects and waits for the client's goroutines to end.
func (rc *Client) Close() {
	_ = rc.c.Disconnect(&paho.Disconnect{})
	<-rc.c.Done()
}

// StartEchoer connects a client that subscribes to topic and echoes every
// message it gets there to the message's response topic, with its
// correlation data and user properties: a request/response service outside
// the broker, two broker hops per round trip.
func StartEchoer(ctx context.Context, addr, id, topic string) (*Client, error) {
	var pubCtx, cancel = context.WithCancel(context.Background())
	echo := func(rc *Client, p *paho.Publish) {
		if p.Properties == nil || p.Properties.ResponseTopic == "" {
			return
		}
		// Publish from another goroutine: paho delivers messages on the
		// goroutine that would read the PUBACK.
		go func() {
			_, _ = rc.c.Publish(pubCtx, &paho.Publish{QoS: 1, Topic: p.Properties.ResponseTopic, Payload: p.Payload,
				Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData, User: p.Properties.User}})
		}()
	}
	rc, err := dial(ctx, addr, id, echo)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := rc.Subscribe(ctx, topic); err != nil {
		cancel()
		rc.Close()
		return nil, err
	}
	go func() { <-rc.c.Done(); cancel() }()
	return rc, nil
}
