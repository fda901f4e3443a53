package localstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/rawmqtt"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// BenchmarkRoundTrip measures one request/response at a time through the
// local store, beside two baselines through the same broker in the same run:
//
//	store:    a raw paho client sends GET to the state store (one hop + the store)
//	loopback: the client publishes QoS 1 to its own response topic (one hop)
//	echo:     the client publishes QoS 1 to a second client that echoes it
//	          back (two hops: a request/response service outside the broker)
//
// The store's overhead is store minus loopback.
func BenchmarkRoundTrip(b *testing.B) {
	benchRoundTrip(b, 1)
}

// BenchmarkRoundTrip64 is BenchmarkRoundTrip with 64 requests in flight on
// one connection; ns/op is the inverse of throughput.
func BenchmarkRoundTrip64(b *testing.B) {
	benchRoundTrip(b, 64)
}

func benchRoundTrip(b *testing.B, inflight int) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ctx := context.Background()
	c, err := rawmqtt.Dial(ctx, srv.Addr(), "bench-client")
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	echo, err := rawmqtt.StartEchoer(ctx, srv.Addr(), "bench-echo", "bench/echo")
	if err != nil {
		b.Fatal(err)
	}
	defer echo.Close()

	clock, _ := hlc.NewClock("bench-client")
	value := make([]byte, 64)
	set := resp.AppendCommand(nil, []byte("SET"), []byte("bench-key-000001"), value)
	if _, err := c.Request(ctx, wire.InvokeTopic, set, paho.UserProperties{{Key: wire.PropTimestamp, Value: clock.Now().String()}}); err != nil {
		b.Fatal(err)
	}
	get := resp.AppendCommand(nil, []byte("GET"), []byte("bench-key-000001"))
	ts := paho.UserProperties{{Key: wire.PropTimestamp, Value: clock.Now().String()}}

	run := func(b *testing.B, topic string, payload []byte, user paho.UserProperties, check func(*paho.Publish) bool) {
		b.ReportAllocs()
		if inflight == 1 {
			for b.Loop() {
				p, err := c.Request(ctx, topic, payload, user)
				if err != nil || !check(p) {
					b.Fatalf("request: %v", err)
				}
			}
			return
		}
		b.SetParallelism((inflight + 1) / 2) // GOMAXPROCS=2 here: 64 goroutines
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, err := c.Request(ctx, topic, payload, user)
				if err != nil || !check(p) {
					b.Errorf("request: %v", err)
					return
				}
			}
		})
	}
	isValue := func(p *paho.Publish) bool { return len(p.Payload) == len(value)+7 }
	isEcho := func(p *paho.Publish) bool { return len(p.Payload) == len(get) }
	b.Run("store", func(b *testing.B) { run(b, wire.InvokeTopic, get, ts, isValue) })
	b.Run("loopback", func(b *testing.B) { run(b, c.ResponseTopic(), get, ts, isEcho) })
	b.Run("echo", func(b *testing.B) { run(b, "bench/echo", get, ts, isEcho) })
}

// BenchmarkExpiry measures how late PX expiry fires: each iteration sets a key
// with PX 10 and waits for its DELETE notification. late-ms is the mean time
// from the PX deadline (counted from the SET's response) to the notification,
// so it includes one network hop.
func BenchmarkExpiry(b *testing.B) {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c := connect(b, srv)
	mustPayload(b, c.do(cmd("KEYNOTIFY", "lease")), okResp)
	const px = 10 * time.Millisecond
	var late, worst time.Duration
	n := 0
	for b.Loop() {
		mustPayload(b, c.do(cmd("SET", "lease", "x", "PX", "10")), okResp)
		deadline := time.Now().Add(px)
		c.next() // SET
		if p := c.next(); string(p.Payload) != "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n" {
			b.Fatalf("got %q", p.Payload)
		}
		d := time.Since(deadline)
		late += d
		worst = max(worst, d)
		n++
	}
	b.ReportMetric(float64(late.Microseconds())/float64(n)/1000, "late-ms")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-late-ms")
}
