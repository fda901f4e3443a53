package localstore_test

import (
	"context"
	"testing"

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
