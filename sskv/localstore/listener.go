package localstore

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// connectTimeout bounds how long a new connection may take to send CONNECT.
const connectTimeout = 10 * time.Second

// listener is the broker's TCP (or TLS) listener. Unlike the broker's own, it
// tracks every accepted connection, so Close can cut connections that never
// finish (a client that never sends CONNECT or stops reading) and returns
// only when every connection goroutine has ended.
type listener struct {
	s     *Server
	id    string
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup // the accept loop and one per connection
	serve chan struct{}  // closed when Serve returns
}

func listen(s *Server, id, addr string, cfg *tls.Config) (*listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("localstore: listen %s: %w", addr, err)
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	return &listener{s: s, id: id, ln: ln, conns: make(map[net.Conn]struct{}), serve: make(chan struct{})}, nil
}

func (l *listener) ID() string              { return l.id }
func (l *listener) Address() string         { return l.ln.Addr().String() }
func (l *listener) Protocol() string        { return "tcp" }
func (l *listener) Init(*slog.Logger) error { return nil }

// Serve accepts connections until Close.
func (l *listener) Serve(establish listeners.EstablishFn) {
	defer close(l.serve)
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		if l.done {
			l.mu.Unlock()
			_ = conn.Close()
			return
		}
		l.conns[conn] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		_ = conn.SetDeadline(time.Now().Add(connectTimeout))
		go func() {
			defer l.wg.Done()
			err := establish(l.id, conn)
			_ = conn.Close()
			l.mu.Lock()
			delete(l.conns, conn)
			l.mu.Unlock()
			l.s.connectionDone(conn)
			if err != nil {
				l.s.log.Debug("connection ended", "remote", conn.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

// Close stops accepting, asks the broker to DISCONNECT its clients, cuts
// whatever is left after the close timeout and waits for every connection
// goroutine.
func (l *listener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	if l.done {
		l.mu.Unlock()
		return
	}
	l.done = true
	l.mu.Unlock()
	_ = l.ln.Close()
	<-l.serve

	deadline := time.Now().Add(l.s.cfg.CloseTimeout)
	l.mu.Lock()
	for c := range l.conns {
		_ = c.SetWriteDeadline(deadline) // a DISCONNECT must not block on a client that does not read
	}
	l.mu.Unlock()
	disconnected := make(chan struct{})
	go func() {
		defer close(disconnected)
		closeClients(l.id)
	}()
	timer := time.NewTimer(l.s.cfg.CloseTimeout)
	select {
	case <-disconnected:
	case <-timer.C:
	}
	timer.Stop()
	l.mu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	<-disconnected
	l.wg.Wait()
}

// connectionDone runs after the broker has finished with a connection. The
// broker removes a client id from its client list when a connection with
// session expiry 0 ends, even if the same id has meanwhile reconnected; this
// puts the current connection back so that it keeps receiving messages.
func (s *Server) connectionDone(conn net.Conn) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	id, ok := s.connIDs[conn]
	if !ok {
		return
	}
	delete(s.connIDs, conn)
	cur := s.conns[id]
	if cur == nil || cur.Net.Conn == conn {
		return
	}
	if got, ok := s.broker.Clients.Get(id); !ok || got != cur {
		s.broker.Clients.Add(cur)
	}
}
