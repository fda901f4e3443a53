package sskv_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/rawmqtt"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// The benchmarks compare a state store GET through sskv with two raw
// paho.golang baselines through the same local broker, QoS 1 both ways:
//
//   - raw-echo: a request published to a topic that a second raw client
//     subscribes to and echoes back to the response topic (the shape of an
//     RPC to a service outside the broker: two broker hops);
//   - raw-loop: a client publishing to a topic it subscribes to itself (one
//     hop, the least any request/response over MQTT can cost).
//
// The state store runs inside the local broker, so a GET is one hop plus the
// store's work.

// benchPayload and benchProps make the raw requests the size of a GET.
var benchPayload = sskv.Command("GET", "bench-key")

func benchProps() paho.UserProperties {
	return paho.UserProperties{
		{Key: "__ts", Value: hlc.Timestamp{Wall: 1700000000000, Node: "bench"}.String()},
		{Key: "__protVer", Value: "1.0"},
		{Key: "__srcId", Value: "bench"},
		{Key: "$partition", Value: "bench"},
	}
}

type benchTarget struct {
	name string
	do   func(context.Context) error
}

func benchTargets(b *testing.B, srv *localstore.Server) []benchTarget {
	ctx := testCtx(b)
	c := dial(b, srv)
	if _, err := c.Set(ctx, "bench-key", []byte("bench-value-0123456789"), sskv.SetOptions{}); err != nil {
		b.Fatal(err)
	}
	echoer, err := rawmqtt.StartEchoer(ctx, srv.Addr(), testID(b), "bench/echo")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(echoer.Close)
	rawE, err := rawmqtt.Dial(ctx, srv.Addr(), testID(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rawE.Close)
	rawL, err := rawmqtt.Dial(ctx, srv.Addr(), testID(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rawL.Close)
	props := benchProps()
	return []benchTarget{
		{"sskv", func(ctx context.Context) error {
			_, err := c.Get(ctx, "bench-key")
			return err
		}},
		{"raw-echo", func(ctx context.Context) error {
			_, err := rawE.Request(ctx, "bench/echo", benchPayload, props)
			return err
		}},
		{"raw-loop", func(ctx context.Context) error {
			_, err := rawL.Request(ctx, rawL.ResponseTopic(), benchPayload, props)
			return err
		}},
	}
}

// BenchmarkGet: one request at a time (latency).
func BenchmarkGet(b *testing.B) {
	srv := startStore(b, localstore.Config{})
	for _, tg := range benchTargets(b, srv) {
		b.Run(tg.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := tg.do(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGetParallel64: 64 requests in flight on one connection
// (throughput).
func BenchmarkGetParallel64(b *testing.B) {
	srv := startStore(b, localstore.Config{})
	procs := runtime.GOMAXPROCS(0)
	for _, tg := range benchTargets(b, srv) {
		b.Run(tg.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism((64 + procs - 1) / procs)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := tg.do(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkIdleWatchers: what an idle watcher of a key of its own costs,
// registration included, once it has had its Initial event and a change:
// heap bytes and goroutines per watcher, for a channel watcher (Watch) and
// a callback watcher (WithCallback).
func BenchmarkIdleWatchers(b *testing.B) {
	const n = 1000
	srv := startStore(b, localstore.Config{})
	other := dial(b, srv)
	ctx := context.Background()
	for _, kind := range []string{"chan", "func"} {
		b.Run(kind, func(b *testing.B) {
			var bytes, goroutines float64
			for b.Loop() {
				// A client of its own, closed at the end: Close waits for
				// the STOPs a callback watcher's Stop sends in the
				// background, before the next round measures.
				c, err := tryDial(b, srv)
				if err != nil {
					b.Fatal(err)
				}
				keys := make([]string, n)
				for i := range keys {
					keys[i] = fmt.Sprintf("idle-%s-%d", kind, i)
				}
				got := make(chan struct{}, n)
				before := footprint()
				ws := make([]*sskv.Watcher, n)
				for i, key := range keys {
					var err error
					if kind == "chan" {
						ws[i], err = c.Watch(ctx, key)
					} else {
						ws[i], err = c.Watch(ctx, key, sskv.WithCallback(func(ev sskv.Event) {
							if !ev.Initial {
								got <- struct{}{}
							}
						}, nil))
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if kind == "chan" {
					for _, w := range ws {
						<-w.Events() // the Initial event, read before the change as a live consumer would
					}
				}
				for _, key := range keys {
					if _, err := other.Set(ctx, key, []byte("x"), sskv.SetOptions{}); err != nil {
						b.Fatal(err)
					}
				}
				for _, w := range ws {
					if kind == "chan" {
						<-w.Events()
					} else {
						<-got
					}
				}
				after := footprint()
				bytes += float64(after.heap) - float64(before.heap)
				goroutines += float64(after.goroutines - before.goroutines)
				for _, w := range ws {
					w.Stop()
				}
				_ = c.Close()
			}
			runs := float64(b.N) * n
			b.ReportMetric(bytes/runs, "heap-B/watcher")
			b.ReportMetric(goroutines/runs, "goroutines/watcher")
		})
	}
}

type heapAndGoroutines struct {
	heap       uint64
	goroutines int
}

func footprint() heapAndGoroutines {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heapAndGoroutines{heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
}
