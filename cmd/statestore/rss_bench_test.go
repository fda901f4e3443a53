package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"

	"github.com/dsslock/dsslock/hlc"
)

// invokeTopic is the state store's request topic (sskv/internal/wire,
// which this package cannot import).
const invokeTopic = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"

// BenchmarkProcessRSS measures the resident memory of the real standalone
// store process: once listening, after DSSLOCK_BENCH_KEYS keys (default
// 10,000; the figure of issue 17 is 1,000,000) of 16 bytes with 32-byte
// values are set over MQTT, and after DSSLOCK_BENCH_CONNS idle MQTT v5
// connections (default 100; the figure is 5,000) are added. It
// reports the RSS at each step (MB), and per key and per connection (B).
//
//	DSSLOCK_BENCH_KEYS=1000000 DSSLOCK_BENCH_CONNS=5000 \
//	    go test -run '^$' -bench ProcessRSS -benchtime 1x ./cmd/statestore/
func BenchmarkProcessRSS(b *testing.B) {
	keys := benchSize(b, "DSSLOCK_BENCH_KEYS", 10_000)
	conns := benchSize(b, "DSSLOCK_BENCH_CONNS", 100)
	for b.Loop() {
		p := startProcB(b)
		pid := p.cmd.Process.Pid
		idle := rss(b, pid)
		loadKeys(b, p.addr, keys)
		withKeys := rss(b, pid)
		cs := make([]net.Conn, 0, conns)
		for i := range conns {
			cs = append(cs, connectIdle(b, p.addr, fmt.Sprintf("idle-%d", i)))
		}
		withConns := rss(b, pid)
		b.ReportMetric(float64(idle)/1e6, "idle-RSS-MB")
		b.ReportMetric(float64(withKeys)/1e6, "keys-RSS-MB")
		b.ReportMetric(float64(withConns)/1e6, "conns-RSS-MB")
		b.ReportMetric(float64(withKeys-idle)/float64(keys), "RSS-B/key")
		b.ReportMetric(float64(withConns-withKeys)/float64(conns), "RSS-B/conn")
		for _, c := range cs {
			_ = c.Close()
		}
	}
}

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

// startProcB starts the store on a free loopback port, as startProc does for
// tests, and stops it when the benchmark ends.
func startProcB(b *testing.B) *storeProc {
	b.Helper()
	p := &storeProc{cmd: exec.Command(storeBinary(b), "-listen", "127.0.0.1:0"), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[2]
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	b.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	select {
	case p.addr = <-addr:
	case <-p.exited:
		b.Fatalf("statestore exited: %v", p.err)
	case <-time.After(processTimeout):
		b.Fatal("statestore did not listen")
	}
	return p
}

// rss returns the resident set size of process pid, in bytes.
func rss(b *testing.B, pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	for line := range bytes.Lines(status) {
		if f := bytes.Fields(line); len(f) == 3 && string(f[0]) == "VmRSS:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS in /proc status")
	return 0
}

// connectIdle opens an MQTT v5 connection with a CONNECT and waits for its
// CONNACK; nothing else is sent.
func connectIdle(b *testing.B, addr, id string) net.Conn {
	nc, err := net.DialTimeout("tcp", addr, processTimeout)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := (&packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true,
		KeepAlive: 600, Properties: &packets.Properties{}}).WriteTo(nc); err != nil {
		b.Fatal(err)
	}
	_ = nc.SetReadDeadline(time.Now().Add(processTimeout))
	if p, err := packets.ReadPacket(nc); err != nil || p.Type != packets.CONNACK {
		b.Fatalf("CONNACK expected, got %v, %v", p, err)
	}
	_ = nc.SetReadDeadline(time.Time{})
	return nc
}

// loadKeys sets n keys of 16 bytes with 32-byte values through one
// connection, with up to 1024 requests in flight, and checks every answer.
func loadKeys(b *testing.B, addr string, n int) {
	const window = 1024
	nc := connectIdle(b, addr, "loader")
	defer nc.Close()
	respTopic := "clients/loader/response"
	if _, err := (&packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: respTopic, QoS: 1}},
		Properties: &packets.Properties{}}).WriteTo(nc); err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	credit := make(chan struct{}, window)
	done := make(chan error, 1)
	w := bufio.NewWriterSize(nc, 64<<10)
	wmu := make(chan struct{}, 1) // guards w
	go func() {
		got := 0
		for got < n {
			p, err := packets.ReadPacket(r)
			if err != nil {
				done <- err
				return
			}
			pub, ok := p.Content.(*packets.Publish)
			if !ok {
				continue // SUBACK, PUBACKs of the requests
			}
			if string(pub.Payload) != "+OK\r\n" {
				done <- fmt.Errorf("SET answered %q", pub.Payload)
				return
			}
			wmu <- struct{}{}
			_, err = (&packets.Puback{PacketID: pub.PacketID, Properties: &packets.Properties{}}).WriteTo(w)
			if err == nil && (got%64 == 63 || got+1 == n) {
				err = w.Flush()
			}
			<-wmu
			if err != nil {
				done <- err
				return
			}
			got++
			<-credit
		}
		done <- nil
	}()
	clock, _ := hlc.NewClock("loader")
	value := bytes.Repeat([]byte("v"), 32)
	for i := range n {
		select {
		case credit <- struct{}{}:
		case err := <-done:
			b.Fatalf("after %d keys: %v", i, err)
		}
		// SET key value, in RESP: a 16-byte key, a 32-byte value.
		payload := fmt.Appendf(nil, "*3\r\n$3\r\nSET\r\n$16\r\nkey-%012d\r\n$32\r\n%s\r\n", i, value)
		corr := binary.BigEndian.AppendUint64(nil, uint64(i))
		pk := &packets.Publish{QoS: 1, PacketID: uint16(i%60000 + 1), Topic: invokeTopic,
			Payload: payload,
			Properties: &packets.Properties{ResponseTopic: respTopic, CorrelationData: corr,
				User: []packets.User{{Key: "__ts", Value: clock.Now().String()}}}}
		wmu <- struct{}{}
		_, err := pk.WriteTo(w)
		if err == nil && (len(credit) == cap(credit) || i+1 == n || i%64 == 63) {
			err = w.Flush()
		}
		<-wmu
		if err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
