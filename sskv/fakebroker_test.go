package sskv_test

import (
	"net"
	"sync"
	"testing"

	"github.com/eclipse/paho.golang/packets"
)

// fakeBroker is a TCP server on loopback that plays a broker (or a server
// that is no broker) with handle, one goroutine per connection. It ends
// with the test, closing its connections.
type fakeBroker struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	n     int
}

func startFakeBroker(t testing.TB, handle func(net.Conn)) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBroker{ln: ln, conns: make(map[net.Conn]struct{})}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns[c] = struct{}{}
			b.n++
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer func() {
					_ = c.Close()
					b.mu.Lock()
					delete(b.conns, c)
					b.mu.Unlock()
				}()
				handle(c)
			}()
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *fakeBroker) Addr() string { return b.ln.Addr().String() }

// accepted is the number of connections accepted so far.
func (b *fakeBroker) accepted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *fakeBroker) close() {
	_ = b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// readConnect reads the client's CONNECT.
func readConnect(c net.Conn) (*packets.Connect, error) {
	p, err := packets.ReadPacket(c)
	if err != nil {
		return nil, err
	}
	cp, _ := p.Content.(*packets.Connect)
	if cp == nil {
		return nil, net.ErrClosed
	}
	return cp, nil
}

// drain reads until the client closes the connection.
func drain(c net.Conn) {
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}
