package localstore

import (
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The store never does network I/O, or waits on a client, while it holds
// s.mu. Publishing through the broker can wait: mochi's publishToClient takes
// the receiving client's lock (Client.NextPacketID), and mochi's writer
// and WritePacket hold that same lock while they write to the client's
// socket. A watcher that stopped reading therefore blocked every publish to
// it, and when that publish happened under s.mu (as notifications did), it
// blocked every request and every new connection until keep-alive dropped the
// watcher.
//
// So a request only queues its notifications, under s.mu, in the outbox of
// each watching connection, which keeps them in version order; a goroutine
// per connection, which runs while its outbox holds notifications, hands
// them to the broker, and only that goroutine waits if the watcher is slow (at most Config.WriteTimeout, see deadlineConn). A
// connection that cannot keep up is disconnected (slowClient), as Redis
// disconnects a slow pub/sub subscriber: never left connected with
// notifications silently lost. The client's reconnect and resync then bring
// it up to date.

// note is one notification waiting to be published, once the writes to
// disk it waits for are durable (wait; nil: none, see persistkeys.go).
type note struct {
	topic   string
	payload []byte
	ts      string
	wait    *batch
}

// outbox is the bounded queue of notifications for one connection.
type outbox struct {
	mu      sync.Mutex
	notes   []note
	running bool // a drain goroutine runs: it ends when notes is empty
}

// notify queues a notification for the connection rec. The caller holds s.mu.
func (s *Server) notify(rec *connRec, n note) {
	select {
	case <-rec.done:
		return // the connection has ended; its watches are ending too
	default:
	}
	if rec.doomed.Load() {
		return
	}
	o := &rec.out
	o.mu.Lock()
	if len(o.notes) >= s.cfg.MaxPendingMessages {
		queued := len(o.notes)
		o.notes = nil
		o.mu.Unlock()
		s.slowClient(rec, "its notification queue is full", "queued", queued, "limit", s.cfg.MaxPendingMessages)
		return
	}
	o.notes = append(o.notes, n)
	if !o.running {
		o.running = true
		s.bg.Add(1)
		go s.drain(rec)
	}
	o.mu.Unlock()
}

// drain publishes rec's notifications in order, until none is left or the
// connection ends. An idle connection has no goroutine of its own here.
func (s *Server) drain(rec *connRec) {
	defer s.bg.Done()
	o := &rec.out
	for {
		o.mu.Lock()
		if len(o.notes) == 0 || rec.doomed.Load() || isDone(rec.done) {
			o.notes = nil
			o.running = false
			o.mu.Unlock()
			return
		}
		n := o.notes[0]
		o.notes[0] = note{}
		o.notes = o.notes[1:]
		o.mu.Unlock()
		if n.wait != nil {
			// A change is notified once what it waits for is durable.
			// Should that fail, it is still sent: writes not persisted
			// stand, and the watchers of a key whose write was undone get
			// a notification of the key as it is again after this one.
			<-n.wait.done
		}
		// Check before publishing: mochi drops a message silently (no
		// hook, "client store quota reached") once a client has
		// Capabilities.MaximumInflight messages unacknowledged.
		if inflight := rec.cl.State.Inflight.Len(); inflight >= s.cfg.MaxPendingMessages {
			s.slowClient(rec, "too many unacknowledged messages", "unacknowledged", inflight, "limit", s.cfg.MaxPendingMessages)
			continue
		}
		props := notifyProps(n.ts)
		if !s.fitsNotification(rec, n.topic, props, len(n.payload)) {
			continue // rec is doomed: the queue is dropped
		}
		s.waitForRoom(rec.cl) // for a client that subscribed at QoS 0 too
		s.publish(n.topic, n.payload, props)
	}
}

// isDone reports whether done is closed.
func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// codeSlowClient is the DISCONNECT reason for a client that cannot keep up.
var codeSlowClient = packets.ErrQuotaExceeded // 0x97

// slowClient disconnects a connection that cannot keep up with what the
// store and the broker send it, with DISCONNECT 0x97 (quota exceeded), once.
func (s *Server) slowClient(rec *connRec, why string, attrs ...any) {
	s.cut(rec, codeSlowClient, "disconnecting client that cannot keep up: "+why, attrs...)
}

// cut disconnects the connection rec with DISCONNECT code, unless the store
// is disconnecting it already, and logs msg with attrs. It never blocks: the
// DISCONNECT waits for the connection's lock, which a write to a full socket
// holds for up to Config.WriteTimeout.
func (s *Server) cut(rec *connRec, code packets.Code, msg string, attrs ...any) {
	if !rec.doomed.CompareAndSwap(false, true) {
		return
	}
	s.log.Warn(msg, append([]any{"client", rec.id, "remote", rec.cl.Net.Remote}, attrs...)...)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		_ = s.broker.DisconnectClient(rec.cl, code)
	}()
}

// recOf returns the record of a connection accepted by our listeners, or nil.
func (s *Server) recOf(cl *mqtt.Client) *connRec {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.recs[cl.Net.Conn]
}

// currentRec returns the record of clientID's current connection, or nil.
func (s *Server) currentRec(clientID string) *connRec {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	cl := s.conns[clientID]
	if cl == nil {
		return nil
	}
	return s.recs[cl.Net.Conn]
}
