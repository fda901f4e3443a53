package localstore

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// Direction selects which traffic of a client's connection Hold stops.
type Direction int

// The directions of a connection's traffic.
const (
	ToStore   Direction = 1 << iota // client -> store: the store reads nothing more from the connection
	FromStore                       // store -> client: nothing more is written to the connection
	Both      = ToStore | FromStore
)

// String returns the name of d.
func (d Direction) String() string {
	switch d {
	case ToStore:
		return "ToStore"
	case FromStore:
		return "FromStore"
	case Both:
		return "Both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// Hold stops the given direction(s) of the traffic of clientID's current
// connection until Release, as a network path that freezes would:
//
//   - ToStore: the store handles nothing more the client sends. It stays in
//     the kernel's buffers (but for what a read in progress takes, held
//     too), and the client's writes eventually block. Packets the broker
//     had already read are still handled. When the read deadline the broker
//     set passes (1.5 x the client's keep-alive since the last packet read,
//     none for keep-alive 0) the connection is dropped, as that of any
//     client gone silent.
//   - FromStore: nothing more is written to the connection: responses,
//     notifications, PUBACKs and PINGRESPs wait, in order, in the store's
//     memory, and go out once the hold ends. The client's requests are
//     still read and executed meanwhile. A write held for
//     Config.WriteTimeout ends the connection, as for any client that does
//     not read (see "Slow clients" in the package documentation).
//
// Holds add up: Hold(id, ToStore) and then Hold(id, FromStore) hold Both.
// A hold applies to the connection current at the time of the call and ends
// with it: a new connection of the same client id is not held, and takes over
// from a held one at once. To partition a client across its reconnects, put
// a TCP proxy between it and the store (package
// github.com/dsslock/dsslock/faultproxy). Kick, Drop and Close never wait
// for a hold; what a connection had held back from its client is never
// delivered (Kick and Close send no DISCONNECT through a held FromStore).
//
// Hold returns an error wrapping ErrNoClient if no client with the given id
// is connected.
func (s *Server) Hold(clientID string, d Direction) error {
	if d&Both == 0 || d&^Both != 0 {
		return fmt.Errorf("localstore: Hold %q: invalid direction %v", clientID, d)
	}
	cl := s.current(clientID)
	if cl == nil {
		return fmt.Errorf("%w: %q", ErrNoClient, clientID)
	}
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoClient, clientID)
	}
	dc.hold(d)
	s.log.Debug("holding connection traffic", "client", clientID, "direction", d, "remote", cl.Net.Remote)
	return nil
}

// Release resumes all held traffic of clientID's connections. It is a no-op
// when nothing is held or the client is gone.
func (s *Server) Release(clientID string) {
	s.connMu.Lock()
	var held []*deadlineConn
	for conn, rec := range s.recs {
		if dc, ok := conn.(*deadlineConn); ok && rec.id == clientID {
			held = append(held, dc)
		}
	}
	s.connMu.Unlock()
	for _, dc := range held {
		if dc.release() {
			dc.flushHeld()
			s.log.Debug("released connection traffic", "client", clientID, "remote", dc.RemoteAddr().String())
		}
	}
}

// cutHeld closes cl's connection at once if its writes are held, so that
// ending it (Kick, Close, a takeover) does not wait for the write timeout.
func cutHeld(cl *mqtt.Client) {
	if dc, ok := cl.Net.Conn.(*deadlineConn); ok && dc.holding(FromStore) {
		_ = dc.Close()
	}
}

// gate holds the traffic of a deadlineConn (see Server.Hold). Reads wait
// at it, bounded by the broker's read deadline; writes made while it holds
// FromStore are kept back (see deadlineConn.write).
type gate struct {
	mu      sync.Mutex
	held    Direction
	resumed chan struct{} // closed by release
	rdl     time.Time     // the read deadline the broker set; zero: none
	shut    bool
	closed  chan struct{} // closed with shut: the connection is closed
}

func (c *deadlineConn) hold(d Direction) {
	g := &c.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		return
	}
	if g.held == 0 {
		g.resumed = make(chan struct{})
	}
	g.held |= d
}

// release ends every hold, and reports whether there was one.
func (c *deadlineConn) release() bool {
	g := &c.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == 0 {
		return false
	}
	g.held = 0
	close(g.resumed)
	return true
}

func (c *deadlineConn) holding(d Direction) bool {
	held, _ := c.gateState(d)
	return held
}

// gateState reports whether d is held, and whether the connection is closed.
func (c *deadlineConn) gateState(d Direction) (held, shut bool) {
	c.gate.mu.Lock()
	defer c.gate.mu.Unlock()
	return c.gate.held&d != 0, c.gate.shut
}

// setReadDeadline sets the socket's read deadline, and records it for held
// reads.
func (c *deadlineConn) setReadDeadline(t time.Time) error {
	c.gate.mu.Lock()
	c.gate.rdl = t
	c.gate.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

// shutGate marks the connection closed: whatever waits at the gate returns.
func (c *deadlineConn) shutGate() {
	g := &c.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.shut {
		g.shut = true
		close(g.closed)
	}
}

// awaitReads waits while reads (ToStore) are held. It returns
// os.ErrDeadlineExceeded when the broker's read deadline passes first, and
// net.ErrClosed when the connection is closed. (Held writes do not wait:
// see deadlineConn.write.)
func (c *deadlineConn) awaitReads() error {
	g := &c.gate
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		g.mu.Lock()
		held, shut := g.held&ToStore != 0, g.shut
		resumed, closed, by := g.resumed, g.closed, g.rdl
		g.mu.Unlock()
		switch {
		case !held:
			return nil
		case shut:
			return net.ErrClosed
		}
		var expired <-chan time.Time
		if !by.IsZero() {
			wait := time.Until(by)
			if wait <= 0 {
				return os.ErrDeadlineExceeded
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			expired = timer.C
		}
		select {
		case <-resumed:
		case <-closed:
		case <-expired:
		}
	}
}

// ResponseFault changes what happens to the responses to one client's
// requests (see Server.SetResponseFault).
type ResponseFault struct {
	// Delay: each response is published this much later, in order among the
	// client's responses. Negative counts as zero.
	Delay time.Duration
	// Drop: the request is executed, and its response is never sent, so the
	// client never learns the outcome.
	Drop bool
}

// SetResponseFault applies f to the requests from clientID executed from now
// on, on any connection of that client id (connected or not yet), until it
// is called again with the zero ResponseFault. Notifications, PUBACKs and
// other MQTT traffic are not affected.
//
// Delayed responses are published by the store in order, each Delay after
// the request was executed (a response never overtakes an earlier one, even
// after Delay is lowered or cleared), to whatever connection of the client
// then subscribes to the response topic. Responses still waiting at Close
// are discarded.
func (s *Server) SetResponseFault(clientID string, f ResponseFault) {
	f.Delay = max(f.Delay, 0)
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	cf := s.faults[clientID]
	if cf == nil {
		if f == (ResponseFault{}) {
			return
		}
		cf = &clientFaults{}
		s.faults[clientID] = cf
	}
	cf.f = f
	if f == (ResponseFault{}) && !cf.sending {
		delete(s.faults, clientID)
	}
	s.log.Debug("response fault set", "client", clientID, "delay", f.Delay, "drop", f.Drop)
}

// clientFaults is the response fault of one client id, and its responses
// waiting to be published.
type clientFaults struct {
	f       ResponseFault
	pending []delayedResponse
	sending bool // a goroutine publishes pending (sendDelayed)
}

// delayedResponse is a response waiting for its time.
type delayedResponse struct {
	at    time.Time
	topic string
	corr  []byte
	res   result
}

// reply publishes the response to a request of clientID, as its response
// fault says. It never waits.
func (s *Server) reply(clientID, topic string, corr []byte, res result) {
	s.faultMu.Lock()
	cf := s.faults[clientID]
	if cf == nil {
		s.faultMu.Unlock()
		s.respond(topic, corr, res)
		return
	}
	switch {
	case cf.f.Drop:
		s.faultMu.Unlock()
		s.log.Debug("response dropped (response fault)", "client", clientID, "topic", topic)
		return
	case cf.f.Delay == 0 && len(cf.pending) == 0:
		s.faultMu.Unlock()
		s.respond(topic, corr, res)
		return
	}
	at := time.Now().Add(cf.f.Delay)
	if n := len(cf.pending); n > 0 && at.Before(cf.pending[n-1].at) {
		at = cf.pending[n-1].at // never before an earlier response
	}
	cf.pending = append(cf.pending, delayedResponse{at: at, topic: topic, corr: corr, res: res})
	start := !cf.sending
	cf.sending = true
	s.faultMu.Unlock()
	if start {
		s.bg.Add(1)
		go s.sendDelayed(clientID, cf)
	}
}

// sendDelayed publishes the delayed responses of clientID, each at its time,
// until there are none left or the server closes.
func (s *Server) sendDelayed(clientID string, cf *clientFaults) {
	defer s.bg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.faultMu.Lock()
		if len(cf.pending) == 0 {
			cf.sending = false
			if cf.f == (ResponseFault{}) && s.faults[clientID] == cf {
				delete(s.faults, clientID)
			}
			s.faultMu.Unlock()
			return
		}
		at := cf.pending[0].at
		s.faultMu.Unlock()
		timer.Reset(time.Until(at))
		select {
		case <-s.stop:
			s.faultMu.Lock()
			n := len(cf.pending)
			cf.pending, cf.sending = nil, false
			s.faultMu.Unlock()
			s.log.Debug("delayed responses discarded: server closed", "client", clientID, "responses", n)
			return
		case <-timer.C:
		}
		s.faultMu.Lock()
		r := cf.pending[0]
		cf.pending[0] = delayedResponse{}
		cf.pending = cf.pending[1:]
		s.faultMu.Unlock()
		s.respond(r.topic, r.corr, r.res)
	}
}
