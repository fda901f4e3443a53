package localstore

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
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

// Close stops accepting, sends every client a DISCONNECT, cuts whatever is
// left after the close timeout and waits for every connection goroutine.
func (l *listener) Close(listeners.CloseFn) {
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
	// The broker's own closeClients can deadlock: it read-locks its client
	// list twice, and a client leaving at the same time queues a writer in
	// between. Disconnect the listener's clients from our own records.
	disconnected := make(chan struct{})
	go func() {
		defer close(disconnected)
		l.s.disconnectAll(l.id)
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

// connRec is an authenticated connection of a client id.
type connRec struct {
	id   string
	cl   *mqtt.Client
	done chan struct{} // closed when the broker has finished with the connection
}

// takeOverTimeout bounds how long a new connection waits for the older
// connection of its client id to be finished with.
const takeOverTimeout = 5 * time.Second

// takeOver makes cl the newest connection of its client id, and first
// disconnects the older one and waits until the broker has finished with it.
//
// The broker tears down an ended connection (unsubscribing its client id's
// topics, removing the id from its client list) concurrently with a new
// connection of the same id setting up, and that teardown can remove the new
// session's subscriptions or client entry: its responses would then be lost.
// A client that reconnects at once after a dropped connection hits this.
// Serialising the two per client id removes the race.
func (s *Server) takeOver(cl *mqtt.Client) {
	rec := &connRec{id: cl.ID, cl: cl, done: make(chan struct{})}
	s.connMu.Lock()
	prev := s.latest[cl.ID]
	s.latest[cl.ID] = rec
	s.recs[cl.Net.Conn] = rec
	s.connMu.Unlock()
	if prev == nil {
		return
	}
	_ = s.broker.DisconnectClient(prev.cl, packets.ErrSessionTakenOver)
	t := time.NewTimer(takeOverTimeout)
	defer t.Stop()
	select {
	case <-prev.done:
	case <-t.C:
		s.log.Warn("older connection of the client id still not finished; going on", "client", cl.ID)
	}
}

// disconnectAll sends DISCONNECT (server shutting down) to every client
// connected through the listener with the given id, and closes them.
func (s *Server) disconnectAll(listenerID string) {
	s.connMu.Lock()
	var cls []*mqtt.Client
	for _, rec := range s.recs {
		if rec.cl.Net.Listener == listenerID {
			cls = append(cls, rec.cl)
		}
	}
	s.connMu.Unlock()
	for _, cl := range cls {
		_ = s.broker.DisconnectClient(cl, packets.ErrServerShuttingDown)
	}
}

// connectionDone runs after the broker has finished with a connection.
func (s *Server) connectionDone(conn net.Conn) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	rec, ok := s.recs[conn]
	if !ok {
		return
	}
	delete(s.recs, conn)
	if s.latest[rec.id] == rec {
		delete(s.latest, rec.id)
	}
	close(rec.done)
}
