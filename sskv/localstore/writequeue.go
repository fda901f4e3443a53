package localstore

import (
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// mochi gives every client a buffered channel of pending writes, of
// Capabilities.MaximumClientWritesPending packets, which its writer
// drains to the socket. A channel of 8192 pointers is 64 KiB per
// connection, allocated when the connection is accepted: two thirds of what
// an idle connection cost. The queue is now writeQueueSize long.
//
// mochi does not wait for room in that channel: a message published to a
// client whose queue is full is dropped (and rolled back from its session).
// So whoever hands mochi a message for a client waits first, while the
// queue holds writeQueueRoom packets or more, until the connection's
// writes make room (deadlineConn.Write signals each one), the connection
// ends, or Config.WriteTimeout passes: then the client cannot keep up and
// is disconnected (slowClient), and the message goes into the half of the
// queue kept free, so it stays in the client's session. Senders wait:
//
//   - in hook.OnPublish, before the broker routes a client's message, for
//     each client subscribed to its topic;
//   - in hook.OnQosPublish, which mochi runs for every new QoS 1 or 2
//     message to a client just before it queues it, on the goroutine that
//     queues it (the publisher's read goroutine, the subscriber's for
//     retained messages, the store's for responses and notifications);
//   - in hook.OnRetainPublished, between the retained messages a
//     subscription gets;
//   - before the store publishes a response or a notification, for clients
//     that subscribed at QoS 0 (which OnQosPublish does not see).
//
// A QoS 1 or 2 message also waits while the client's socket write is
// blocked, as mochi's writer holds the client's lock while it writes and
// mochi takes that lock to number the message. Senders to one client pass
// the check concurrently only in the rare case that they race on the same
// packet, and the free half of the queue (writeQueueSize - writeQueueRoom)
// absorbs that; should mochi drop a message anyway, the client is
// disconnected (hook.OnPublishDropped), as before. Only a Will message,
// published as its client's connection ends, does not wait.
//
// mochi does not export the queue's length: writesQueued reads the
// channel's length through reflection, on the unexported field
// ClientState.outbound, read-only. TestWriteQueueFound fails if a mochi
// upgrade renames it; should the field be missing at run time, the store
// keeps mochi's queue as long as MaxPendingMessages, as it used to.
const (
	writeQueueSize = 128 // mochi's MaximumClientWritesPending, when writesQueued works
	writeQueueRoom = 64  // senders wait while this many packets are queued
)

// outboundField is the index of mochi's ClientState.outbound, or -1.
var outboundField = func() int {
	f, ok := reflect.TypeFor[mqtt.ClientState]().FieldByName("outbound")
	if !ok || len(f.Index) != 1 || f.Type != reflect.TypeFor[chan *packets.Packet]() {
		return -1
	}
	return f.Index[0]
}()

// writeQueueKnown reports whether writesQueued can see mochi's queue.
func writeQueueKnown() bool { return outboundField >= 0 }

// writesQueued returns how many packets wait in cl's queue of pending
// writes (0 when that cannot be known).
func writesQueued(cl *mqtt.Client) int {
	if outboundField < 0 {
		return 0
	}
	return reflect.ValueOf(&cl.State).Elem().Field(outboundField).Len()
}

// room wakes senders waiting for room in the broker's queue of writes to a
// connection. It costs nothing while nobody waits.
type room struct {
	waiting atomic.Int32
	mu      sync.Mutex
	ch      chan struct{} // closed by signal; nil: nobody took it
}

// wait registers a waiter and returns the channel the next signal closes.
// The waiter must check its condition after wait, then select on the
// channel, and call leave.
func (r *room) wait() <-chan struct{} {
	r.waiting.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

func (r *room) leave() { r.waiting.Add(-1) }

// signal wakes every waiter.
func (r *room) signal() {
	if r.waiting.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch != nil {
		close(r.ch)
		r.ch = nil
	}
}

// waitForSubscribers waits for room (see waitForRoom) in the queue of
// every client subscribed to topic.
func (s *Server) waitForSubscribers(topic string) {
	subs := s.broker.Topics.Subscribers(topic)
	for id := range subs.Subscriptions {
		if cl, ok := s.broker.Clients.Get(id); ok {
			s.waitForRoom(cl)
		}
	}
	for _, group := range subs.Shared {
		for id := range group {
			if cl, ok := s.broker.Clients.Get(id); ok {
				s.waitForRoom(cl)
			}
		}
	}
}

// waitForRoom returns once cl's queue of pending writes has room for one
// more message: at once when fewer than writeQueueRoom packets wait in it
// (the usual case), otherwise when the connection's writes have made room,
// the connection has ended, or Config.WriteTimeout has passed, and then the
// client is disconnected as one that cannot keep up. It never holds s.mu.
func (s *Server) waitForRoom(cl *mqtt.Client) {
	if cl == nil || cl.Net.Inline || writesQueued(cl) < writeQueueRoom || cl.Closed() {
		return
	}
	dc, ok := cl.Net.Conn.(*deadlineConn)
	if !ok {
		return
	}
	if f := s.onRoomWait.Load(); f != nil {
		(*f)(cl.ID)
	}
	timer := time.NewTimer(s.cfg.WriteTimeout)
	defer timer.Stop()
	for {
		ch := dc.room.wait()
		if writesQueued(cl) < writeQueueRoom {
			dc.room.leave()
			return
		}
		select {
		case <-ch:
			dc.room.leave()
		case <-dc.gate.closed:
			dc.room.leave()
			return
		case <-timer.C:
			dc.room.leave()
			if rec := s.recOf(cl); rec != nil {
				s.slowClient(rec, "its queue of pending writes stayed full",
					"queued", writesQueued(cl), "write_timeout", s.cfg.WriteTimeout)
			}
			return
		}
	}
}
