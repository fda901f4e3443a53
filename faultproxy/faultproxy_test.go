package faultproxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitTimeout = 10 * time.Second

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func start(t *testing.T, opts faultproxy.Options) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(echoServer(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func connect(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBlackholeHeal: a frozen connection forwards nothing but stays open;
// a connection made during the blackhole works; Heal delivers what was held.
func TestBlackholeHeal(t *testing.T) {
	p := start(t, faultproxy.Options{})
	old := connect(t, p)
	roundTrip(t, old, "before")

	p.Blackhole()
	if _, err := old.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	_ = old.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var one [1]byte
	if _, err := old.Read(one[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a blackholed connection: %v (want a timeout: nothing forwarded, nothing closed)", err)
	}

	fresh := connect(t, p)
	roundTrip(t, fresh, "new path")

	p.Heal()
	_ = old.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, len("during"))
	if _, err := io.ReadFull(old, got); err != nil || string(got) != "during" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
	roundTrip(t, old, "after")
}

// TestBlackholeFillsBuffers: with small buffers, a writer to a frozen
// connection blocks.
func TestBlackholeFillsBuffers(t *testing.T) {
	p := start(t, faultproxy.Options{BufferSize: 32 << 10})
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.Blackhole()
	_ = c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	total := 0
	for {
		n, err := c.Write(chunk)
		total += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			break
		}
		if total > 64<<20 {
			t.Fatalf("wrote %d bytes into a frozen connection without blocking", total)
		}
	}
	t.Logf("a frozen connection took %d bytes before the writer blocked", total)
}

// TestCut: every connection is closed; new ones work.
func TestCut(t *testing.T) {
	p := start(t, faultproxy.Options{})
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	var one [1]byte
	if _, err := c.Read(one[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Cut: %v, want the connection closed", err)
	}
	eventually(t, "no links", func() bool { return p.Links() == 0 })
	roundTrip(t, connect(t, p), "again")
}

// TestPartition: Partition ends the connections open now and every new one
// until Heal.
func TestPartition(t *testing.T) {
	p := start(t, faultproxy.Options{})
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.Partition()
	closed := func(c net.Conn) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
		var one [1]byte
		if _, err := c.Read(one[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read during the partition: %v, want the connection closed", err)
		}
	}
	closed(c)
	closed(connect(t, p))
	p.Heal()
	roundTrip(t, connect(t, p), "again")
}

// TestClientCloseObserved: the proxy notices a client that closes its side,
// also while the connection is frozen.
func TestClientCloseObserved(t *testing.T) {
	p := start(t, faultproxy.Options{})
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.Blackhole()
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	if p.Links() != 1 {
		t.Fatalf("Links = %d, want 1", p.Links())
	}
	_ = c.Close()
	eventually(t, "the link to end", func() bool { return p.Links() == 0 })
	if p.Accepted() != 1 {
		t.Fatalf("Accepted = %d", p.Accepted())
	}
}

// TestCloseWhileFrozen: Close ends everything, also frozen connections with
// blocked writers on both sides.
func TestCloseWhileFrozen(t *testing.T) {
	p, err := faultproxy.Start(echoServer(t), faultproxy.Options{BufferSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.Blackhole()
	_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	for {
		if _, err := c.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("client side still open after Close")
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("Dial after Close succeeded")
	}
}

// TestSmallBuffersFlow: data keeps flowing both ways through small buffers.
func TestSmallBuffersFlow(t *testing.T) {
	p := start(t, faultproxy.Options{BufferSize: 32 << 10})
	c := connect(t, p)
	msg := bytes.Repeat([]byte("m"), 70000)
	done := make(chan error, 1)
	go func() {
		for range 50 {
			if _, err := c.Write(msg); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, 50*len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat(msg, 50)) {
		t.Fatal("data changed on the way")
	}
}

// TestDelay: with a delay, bytes arrive no sooner than the delay in each
// direction, on a connection open before SetDelay and on a later one, and
// a stream arrives whole and in order.
func TestDelay(t *testing.T) {
	p := start(t, faultproxy.Options{})
	old := connect(t, p)
	roundTrip(t, old, "before")

	const d = 100 * time.Millisecond
	p.SetDelay(d)
	fresh := connect(t, p)
	for name, c := range map[string]net.Conn{"open": old, "later": fresh} {
		begin := time.Now()
		roundTrip(t, c, "delayed")
		if rtt := time.Since(begin); rtt < 2*d {
			t.Errorf("%s connection: round trip %v, want at least 2×%v", name, rtt, d)
		}
	}

	// A stream of writes of many sizes, some larger than a read, and more
	// in all than the proxy holds per direction.
	var want bytes.Buffer
	for i := range 300 {
		fmt.Fprintf(&want, "%d:%s;", i, bytes.Repeat([]byte{'a' + byte(i%26)}, i*i%3000))
	}
	done := make(chan error, 1)
	go func() {
		rest := want.Bytes()
		for i := 1; len(rest) > 0; i++ {
			n := min(len(rest), i*i%70000+1)
			if _, err := fresh.Write(rest[:n]); err != nil {
				done <- err
				return
			}
			rest = rest[n:]
		}
		done <- nil
	}()
	begin := time.Now()
	_ = fresh.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(fresh, got[:1]); err != nil {
		t.Fatal(err)
	}
	if first := time.Since(begin); first < 2*d {
		t.Errorf("first byte of the stream back after %v, want at least 2×%v", first, d)
	}
	if _, err := io.ReadFull(fresh, got[1:]); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("%d bytes changed on the way", want.Len())
	}
}

// TestDelayRemoved: SetDelay(0), or a negative delay, removes the delay and
// delivers the bytes waiting for it at once.
func TestDelayRemoved(t *testing.T) {
	p := start(t, faultproxy.Options{})
	c := connect(t, p)
	roundTrip(t, c, "x")
	for _, off := range []time.Duration{0, -time.Second} {
		p.SetDelay(time.Hour)
		if _, err := c.Write([]byte("waiting")); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var one [1]byte
		if _, err := c.Read(one[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read with an hour's delay: %v, want a timeout", err)
		}
		p.SetDelay(off)
		_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
		got := make([]byte, len("waiting"))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "waiting" {
			t.Fatalf("after SetDelay(%v): %q, %v", off, got, err)
		}
		roundTrip(t, c, "no delay")
		roundTrip(t, connect(t, p), "no delay")
	}
}

// TestDelayClientClose: a delayed connection notices a client that closes
// its side.
func TestDelayClientClose(t *testing.T) {
	p := start(t, faultproxy.Options{})
	p.SetDelay(50 * time.Millisecond)
	c := connect(t, p)
	roundTrip(t, c, "x")
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	eventually(t, "the link to end", func() bool { return p.Links() == 0 })
}

// TestDelayBlackholeCut: Blackhole holds bytes that are due; Heal delivers
// them; Cut closes a delayed connection at once.
func TestDelayBlackholeCut(t *testing.T) {
	p := start(t, faultproxy.Options{})
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.SetDelay(time.Hour)
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	p.SetDelay(0) // due now, but frozen
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	var one [1]byte
	if _, err := c.Read(one[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a blackholed connection: %v, want a timeout", err)
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	got := make([]byte, len("held"))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}

	p.SetDelay(time.Hour)
	if _, err := c.Write([]byte("cut")); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := c.Read(one[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Cut: %v, want the connection closed", err)
	}
	eventually(t, "no links", func() bool { return p.Links() == 0 })
}

// TestCloseWhileDelayed: Close does not wait out a delay.
func TestCloseWhileDelayed(t *testing.T) {
	p, err := faultproxy.Start(echoServer(t), faultproxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, p)
	roundTrip(t, c, "x")
	p.SetDelay(time.Hour)
	if _, err := c.Write([]byte("in flight")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Close waits out the delay")
	}
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("client side still open after Close")
	}
}
