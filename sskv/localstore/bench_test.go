package localstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"golang.org/x/sync/errgroup"

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

// footprint is the heap in use and the goroutine stacks.
type footprint struct{ heap, stacks uint64 }

func (f footprint) total() uint64 { return f.heap + f.stacks }

// memFootprint is the heap in use and the goroutine stacks, after GC.
func memFootprint() footprint {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{ms.HeapAlloc, ms.StackInuse}
}

// reportFootprint reports what the growth from before to after costs per
// unit, in total and split into heap and stacks, and writes a heap profile
// to the file DSSLOCK_BENCH_HEAPPROFILE names, if any, to see where.
func reportFootprint(b *testing.B, before, after footprint, n int, unit string) {
	b.ReportMetric(float64(after.total()-before.total())/float64(n), "B/"+unit)
	b.ReportMetric(float64(after.heap-before.heap)/float64(n), "heap-B/"+unit)
	b.ReportMetric(float64(after.stacks-before.stacks)/float64(n), "stack-B/"+unit)
	if name := os.Getenv("DSSLOCK_BENCH_HEAPPROFILE"); name != "" {
		f, err := os.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSize is the size in the environment variable name, or def.
func benchSize(b *testing.B, name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q", name, v)
		}
		return n
	}
	return def
}

// BenchmarkKeyCost: what a stored key costs the store: n keys of 16 bytes
// with 32-byte values, set through one connection (64 requests in flight),
// heap and stacks after GC over before, per key. n is
// DSSLOCK_BENCH_KEYS (default 100,000; the figure of the scale issue is
// 1,000,000).
func BenchmarkKeyCost(b *testing.B) {
	n := benchSize(b, "DSSLOCK_BENCH_KEYS", 100_000)
	for b.Loop() {
		srv, err := localstore.Start(localstore.Config{})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		c, err := rawmqtt.Dial(ctx, srv.Addr(), "bench-keys")
		if err != nil {
			b.Fatal(err)
		}
		clock, _ := hlc.NewClock("bench-keys")
		before := memFootprint()
		var g errgroup.Group
		g.SetLimit(64)
		value := make([]byte, 32)
		for i := range n {
			g.Go(func() error {
				key := fmt.Appendf(nil, "key-%012d", i)
				set := resp.AppendCommand(nil, []byte("SET"), key, value)
				_, err := c.Request(ctx, wire.InvokeTopic, set, paho.UserProperties{{Key: wire.PropTimestamp, Value: clock.Now().String()}})
				return err
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		reportFootprint(b, before, memFootprint(), n, "key")
		c.Close()
		_ = srv.Close()
	}
}

// BenchmarkIdleConnectionCost: what an idle MQTT v5 connection costs the
// store: n bare connections (a CONNECT on a TCP socket, no client library
// on this side), heap and stacks after GC over before, per connection. n
// is DSSLOCK_BENCH_CONNS (default 1,000).
func BenchmarkIdleConnectionCost(b *testing.B) {
	n := benchSize(b, "DSSLOCK_BENCH_CONNS", 1000)
	for b.Loop() {
		srv, err := localstore.Start(localstore.Config{})
		if err != nil {
			b.Fatal(err)
		}
		before := memFootprint()
		conns := make([]net.Conn, 0, n)
		for i := range n {
			nc, err := net.Dial("tcp", srv.Addr())
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, nc)
			cp := packets.NewControlPacket(packets.CONNECT)
			cc := cp.Content.(*packets.Connect)
			cc.ProtocolName, cc.ProtocolVersion = "MQTT", 5
			cc.ClientID, cc.CleanStart, cc.KeepAlive = fmt.Sprintf("idle-%d", i), true, 600
			if _, err := cp.WriteTo(nc); err != nil {
				b.Fatal(err)
			}
			if _, err := packets.ReadPacket(nc); err != nil { // CONNACK
				b.Fatal(err)
			}
		}
		reportFootprint(b, before, memFootprint(), n, "conn")
		for _, nc := range conns {
			_ = nc.Close()
		}
		_ = srv.Close()
	}
}
