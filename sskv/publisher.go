package sskv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// The publisher hands requests to paho one at a time, on a goroutine that
// runs only while some are queued, and learns of their PUBACKs from paho's
// session rather than from a goroutine blocked in paho's Publish for each
// request in flight. So a request in flight costs no goroutine, and a burst
// of requests (a thousand elections starting at once) leaves no goroutine
// records behind: the runtime keeps the record of every goroutine it has
// run at once, for good.
//
// paho's Publish blocks until the PUBACK; the publisher makes it return as
// soon as the PUBLISH is in the session and written, by ending the context
// it passed once paho's session has taken the packet (trackedSession's
// AddToSession). From then on the session reports the job's end: its
// PUBACK, or the end of the session (a clean start, Close).
//
// A request waits in the queue only while the one before it is written.
// One whose caller gives up while it waits is taken out, and never sent.
// This is used only when the client made its connection manager: a
// connection from NewFromConnection has paho's own session, and each
// request publishes on a goroutine of its own.
type publisher struct {
	c *Client

	mu      sync.Mutex
	queue   []*pubJob
	running bool    // the writer runs
	cur     *pubJob // the job being published: what AddToSession is given
	// tracked are the jobs in paho's session, by packet id, until their
	// PUBACK or the session's end.
	tracked     map[uint16]*pubJob
	trackedPeak int
	epoch       uint64 // sessions ended so far: a job added to an ended one is over

	waiting atomic.Int64  // jobs queued, not yet taken or dropped
	sends   atomic.Uint64 // jobs handed to paho so far
	dropped atomic.Uint64 // jobs dropped unsent so far, their callers having given up
}

// pubJob is one request's PUBLISH, from the queue to its PUBACK.
type pubJob struct {
	pub   *paho.Publish
	ctx   context.Context // the caller's: the job is not sent once it ends
	state atomic.Int32    // jobQueued, then jobTaken or jobDropped
	done  chan pubResult  // buffered: the job's one outcome
	// release frees the job's slot of the connection and its binding. It
	// is called once, by whoever ends the job: the caller that drops it,
	// the writer that fails to hand it to paho, or the session.
	release func()
	// Guarded by publisher.mu.
	ack       chan packets.ControlPacket // paho's session answers on it, once the job is in it
	added     bool                       // in paho's session
	epoch     uint64                     // the session's epoch when the writer handed it to paho
	pubCancel context.CancelFunc         // ends the context of the writer's Publish
}

const (
	jobQueued int32 = iota
	jobTaken
	jobDropped
)

// errDropped is the outcome of a job whose caller gave up before the
// writer took it: it was not sent.
var errDropped = errors.New("sskv: the request's caller gave up before it was sent")

// errSessionEnded is the outcome of a job whose PUBLISH was in the MQTT
// session when the session ended (a clean start, or Close) before its
// PUBACK: it may have been executed.
var errSessionEnded = errors.New("PUBLISH sent but not acknowledged before the MQTT session ended")

func newPublisher(c *Client) *publisher { return &publisher{c: c, tracked: make(map[uint16]*pubJob)} }

// publish queues pub and returns its job; the job's outcome comes on done.
func (p *publisher) publish(ctx context.Context, pub *paho.Publish, release func()) *pubJob {
	j := &pubJob{pub: pub, ctx: ctx, done: make(chan pubResult, 1), release: release}
	p.waiting.Add(1)
	p.mu.Lock()
	p.queue = append(p.queue, j)
	start := !p.running
	p.running = true
	p.mu.Unlock()
	if start && !p.c.spawn(p.run) {
		p.mu.Lock()
		q := p.queue
		p.queue, p.running = nil, false
		p.mu.Unlock()
		for _, j := range q {
			if j.drop(p) {
				j.done <- pubResult{err: ErrClosed}
			}
		}
	}
	return j
}

// drop takes j out of the queue if the writer has not taken it yet, and
// reports whether it did: the job was not sent, and its slot is freed.
func (j *pubJob) drop(p *publisher) bool {
	if !j.state.CompareAndSwap(jobQueued, jobDropped) {
		return false
	}
	p.waiting.Add(-1)
	p.dropped.Add(1)
	j.release()
	return true
}

// run is the writer: it publishes the queued jobs in order, and ends when
// the queue is empty.
func (p *publisher) run() {
	for {
		p.mu.Lock()
		batch := p.queue
		p.queue = nil
		if len(batch) == 0 {
			p.running = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		for i, j := range batch {
			batch[i] = nil
			if i > 0 {
				// paho starts a goroutine for each packet it adds to the
				// session, which ends as soon as it runs. Left to wait
				// while the writer goes on, hundreds of them pile up in a
				// burst, and the runtime keeps the record of every
				// goroutine that ever ran at once: yield, so that each ends
				// before the next is started.
				runtime.Gosched()
			}
			p.send(j)
		}
	}
}

// send hands j to paho, unless its caller has given up.
func (p *publisher) send(j *pubJob) {
	if j.ctx.Err() != nil {
		if j.drop(p) {
			j.done <- pubResult{err: errDropped}
		}
		return
	}
	if !j.state.CompareAndSwap(jobQueued, jobTaken) {
		return // dropped by its caller
	}
	p.waiting.Add(-1)
	p.sends.Add(1)
	// Its Message Expiry is what its caller has left now, not when it
	// was queued: the broker drops it once its caller has given up.
	if pp := j.pub.Properties; pp != nil && pp.MessageExpiry != nil {
		*pp.MessageExpiry = expirySeconds(j.ctx)
	}
	// The context ends once the session has the packet (see added), so
	// that Publish returns after its write rather than at the PUBACK. It
	// needs no parent: paho's session gives up on a packet it cannot take
	// when the connection ends, and Close ends the connection.
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.Lock()
	p.cur, j.pubCancel = j, cancel
	p.mu.Unlock()
	_, err := p.c.cm.Publish(ctx, j.pub)
	cancel()
	p.mu.Lock()
	p.cur = nil
	added := j.added
	p.mu.Unlock()
	if !added {
		j.release()
		j.done <- pubResult{err: err}
	}
}

// current returns the job being published if packet is its PUBLISH.
func (p *publisher) current(packet session.Packet) *pubJob {
	pb, ok := packet.(*packets.Publish)
	if !ok || pb.Properties == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	j := p.cur
	if j == nil || j.added || j.pub.Properties == nil || !bytes.Equal(pb.Properties.CorrelationData, j.pub.Properties.CorrelationData) {
		return nil
	}
	j.epoch = p.epoch
	return j
}

// added records that paho's session holds j under packet id, and lets
// paho's Publish return once it has written it.
func (p *publisher) added(j *pubJob, id uint16, ack chan packets.ControlPacket) {
	p.mu.Lock()
	// An id is reused only once paho has ended its last transaction, and
	// it answers that one's channel first: end it here, in case the PUBACK
	// that freed the id has not reached acked yet.
	if old := p.tracked[id]; old != nil {
		p.endLocked(id, old)
	}
	j.ack, j.added = ack, true
	p.tracked[id] = j
	p.trackedPeak = max(p.trackedPeak, len(p.tracked))
	if j.epoch != p.epoch {
		// The session was cleared between paho's taking the packet and
		// now: nothing will answer it.
		p.endLocked(id, j)
	}
	cancel := j.pubCancel
	p.mu.Unlock()
	cancel()
}

// acked ends the job whose PUBACK paho's session has just handled.
func (p *publisher) acked(id uint16) {
	p.mu.Lock()
	if j := p.tracked[id]; j != nil {
		select {
		case cp := <-j.ack:
			p.finishLocked(id, j, cp)
		default: // not this job's answer: paho did not know the id
		}
	}
	p.mu.Unlock()
}

// endLocked ends the tracked job j, with the answer paho gave it, if any.
func (p *publisher) endLocked(id uint16, j *pubJob) {
	var cp packets.ControlPacket
	select {
	case cp = <-j.ack:
	default:
	}
	p.finishLocked(id, j, cp)
}

// finishLocked delivers j's outcome: its PUBACK, or (cp is zero) the end of
// the session before one.
func (p *publisher) finishLocked(id uint16, j *pubJob, cp packets.ControlPacket) {
	delete(p.tracked, id)
	p.tracked = shrunk(p.tracked, &p.trackedPeak)
	var r pubResult
	switch pa := cp.Content.(type) {
	case *packets.Puback:
		r.pr = paho.PublishResponseFromPuback(pa)
		if pa.ReasonCode >= 0x80 {
			r.err = fmt.Errorf("PUBACK: %s", pa.Reason())
		}
	default:
		r.err = errSessionEnded
	}
	j.release()
	j.done <- r
}

// endAll ends every tracked job: the session that held them has ended.
func (p *publisher) endAll() {
	p.mu.Lock()
	p.epoch++
	for id, j := range p.tracked {
		p.endLocked(id, j)
	}
	p.mu.Unlock()
}

// trackedSession is paho's session state, with the publisher told of what
// happens to its jobs.
type trackedSession struct {
	*state.State
	p *publisher
}

func (s trackedSession) AddToSession(ctx context.Context, packet session.Packet, resp chan<- packets.ControlPacket) error {
	j := s.p.current(packet)
	if j == nil {
		return s.State.AddToSession(ctx, packet, resp)
	}
	if j.ctx.Err() != nil {
		// Its caller gave up while paho prepared it: not sent.
		return errDropped
	}
	ack := make(chan packets.ControlPacket, 1)
	if err := s.State.AddToSession(ctx, packet, ack); err != nil {
		return err
	}
	s.p.added(j, packet.(*packets.Publish).PacketID, ack)
	return nil
}

func (s trackedSession) PacketReceived(recv *packets.ControlPacket, pubChan chan<- *packets.Publish) error {
	err := s.State.PacketReceived(recv, pubChan)
	if pa, ok := recv.Content.(*packets.Puback); ok {
		s.p.acked(pa.PacketID)
	}
	return err
}

func (s trackedSession) Close() error {
	err := s.State.Close()
	s.p.endAll()
	return err
}
