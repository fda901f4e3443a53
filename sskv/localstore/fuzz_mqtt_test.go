package localstore_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/internal/rawmqtt"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// fuzzMaxPacket is the store's packet limit in FuzzMQTTInput: it is what
// bounds the memory a connection can make the store allocate.
const fuzzMaxPacket = 64 << 10

// FuzzMQTTInput writes arbitrary bytes to a real connection to one store
// (reused across execs), after a valid CONNECT or instead of it: packets with
// arbitrary declared lengths, flags and properties. The store must not
// panic, must keep answering another client, and its heap must stay bounded.
func FuzzMQTTInput(f *testing.F) {
	var seq atomic.Int64
	connect := func(id string) []byte {
		var b bytes.Buffer
		rm := uint16(10)
		_, _ = (&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true,
			KeepAlive: 30, Properties: &packets.Properties{ReceiveMaximum: &rm}}).WriteTo(&b)
		return b.Bytes()
	}
	request := func(qos byte, respTopic string, args ...string) []byte {
		bs := make([][]byte, len(args))
		for i, a := range args {
			bs[i] = []byte(a)
		}
		var b bytes.Buffer
		_, _ = (&packets.Publish{QoS: qos, PacketID: 7, Topic: wire.InvokeTopic, Payload: resp.AppendCommand(nil, bs...),
			Properties: &packets.Properties{ResponseTopic: respTopic, CorrelationData: []byte("c"),
				User: []packets.User{{Key: "__ts", Value: "1:0:x"}}}}).WriteTo(&b)
		return b.Bytes()
	}
	f.Add(true, request(1, "r", "SET", "k", "v"))
	f.Add(true, request(2, "r/+", "GET", "k"))
	f.Add(true, request(0, "", "KEYNOTIFY", "k"))
	f.Add(true, append(lengthHeader(0x32, 268435455), 0, 1, 'x'))
	f.Add(true, []byte{0x82, 0x09, 0, 1, 3, 0x0b, 0xff, 0xff, 0x7f, 0, 1}) // SUBSCRIBE, subscription id out of range
	f.Add(true, []byte{0xe0, 0x02, 0x97, 0x00})                            // DISCONNECT
	f.Add(false, append(lengthHeader(0x10, 268435455), 0, 4, 'M', 'Q'))
	f.Add(false, []byte("GET / HTTP/1.1\r\n\r\n"))

	srv, err := localstore.Start(localstore.Config{MaxPacketSize: fuzzMaxPacket})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = srv.Close() })
	var probe *rawmqtt.Client
	f.Cleanup(func() {
		if probe != nil {
			probe.Close()
		}
	})
	get := resp.AppendCommand(nil, []byte("GET"), []byte("fuzz-probe"))
	// serving reports whether the store answers a GET (from a new connection
	// if the probe's was taken over or cut by the fuzzed input).
	serving := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var err error
		for range 2 {
			if probe == nil {
				if probe, err = rawmqtt.Dial(ctx, srv.Addr(), fmt.Sprintf("fuzz-probe-%d", seq.Add(1))); err != nil {
					continue
				}
			}
			var p *paho.Publish
			if p, err = probe.Request(ctx, wire.InvokeTopic, get, nil); err == nil && string(p.Payload) == nullResp {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("GET answered %q", p.Payload)
			}
			probe.Close()
			probe = nil
		}
		return err
	}

	f.Fuzz(func(t *testing.T, withConnect bool, data []byte) {
		c, err := net.Dial("tcp", srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if withConnect {
			if _, err := c.Write(connect(fmt.Sprintf("fuzz-%d", seq.Add(1)))); err != nil {
				t.Fatal(err)
			}
		}
		_, _ = c.Write(data) // the store may close the connection before reading everything
		if err := serving(); err != nil {
			t.Fatalf("store stopped serving: %v", err)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapAlloc > 256<<20 {
			t.Fatalf("heap %d MB after an input of %d bytes", ms.HeapAlloc>>20, len(data))
		}
	})
}
