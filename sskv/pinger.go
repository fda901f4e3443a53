package sskv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho/log"
)

// errPingTimeout ends a connection whose broker did not answer a ping.
var errPingTimeout = errors.New("no answer to PINGREQ")

// pinger is the client's paho.Pinger. It finds a dead (half-open)
// connection in a ping's time:
//
//   - when nothing has been both sent and received for a keep-alive, it
//     sends PINGREQ (as paho's DefaultPinger does);
//   - when asked to probe (a request timed out on the connection), it sends
//     PINGREQ at once;
//   - when no packet at all arrives within timeout of a PINGREQ, it closes
//     the connection and returns an error, so that autopaho reconnects.
//     Any packet counts as an answer: the broker is alive.
//
// One pinger serves every connection of a Client, one at a time (autopaho
// runs a connection's pinger only after the previous one has ended).
type pinger struct {
	timeout time.Duration
	probeCh chan struct{} // buffered: a probe is wanted

	mu       sync.Mutex
	lastSent time.Time
	lastRecv time.Time
	running  bool
}

func newPinger(timeout time.Duration) *pinger {
	return &pinger{timeout: timeout, probeCh: make(chan struct{}, 1)}
}

// probe asks the running pinger to ping now, unless a ping is already
// waiting for its answer. It never blocks.
func (p *pinger) probe() {
	select {
	case p.probeCh <- struct{}{}:
	default:
	}
}

// Run pings on conn until ctx ends or the broker fails to answer a ping,
// and returns only after its own goroutines have ended. A dead connection
// is closed before Run returns its error.
func (p *pinger) Run(ctx context.Context, conn net.Conn, keepAlive uint16) error {
	if conn == nil {
		return errors.New("pinger: nil connection")
	}
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("pinger: already running")
	}
	p.running = true
	now := time.Now()
	p.lastSent, p.lastRecv = now, now // CONNECT and CONNACK
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	select { // a probe asked for on an earlier connection
	case <-p.probeCh:
	default:
	}

	interval := time.Duration(keepAlive) * time.Second
	var (
		wg       sync.WaitGroup
		writing  atomic.Bool
		errCh    = make(chan error, 1)
		pingSent time.Time // zero: no ping awaits its answer
	)
	defer wg.Wait()
	fail := func(err error) error {
		abortConn(conn) // also unblocks a write stuck on a full socket
		return err
	}
	ping := func() {
		pingSent = time.Now()
		if writing.Load() {
			return // the last PINGREQ is still being written; it serves
		}
		writing.Store(true)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer writing.Store(false)
			if _, err := packets.NewControlPacket(packets.PINGREQ).WriteTo(conn); err != nil {
				select {
				case errCh <- fmt.Errorf("sending PINGREQ: %w", err):
				default:
				}
			}
		}()
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		p.mu.Lock()
		sent, recv := p.lastSent, p.lastRecv
		p.mu.Unlock()
		if !pingSent.IsZero() && recv.After(pingSent) {
			pingSent = time.Time{} // answered
		}
		var wait time.Duration
		switch {
		case !pingSent.IsZero():
			if now.Sub(pingSent) >= p.timeout {
				return fail(fmt.Errorf("%w within %v", errPingTimeout, p.timeout))
			}
			wait = pingSent.Add(p.timeout).Sub(now)
		case interval > 0:
			due := sent
			if recv.Before(due) {
				due = recv
			}
			due = due.Add(interval)
			if !now.Before(due) {
				ping()
				continue
			}
			wait = due.Sub(now)
		default: // keep alive off (the broker's choice): probes only
			wait = time.Hour
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			if writing.Load() {
				_ = conn.Close() // the client is shutting the connection down anyway
			}
			return nil
		case err := <-errCh:
			return fail(err)
		case <-p.probeCh:
			if pingSent.IsZero() {
				ping()
			}
		case <-timer.C:
		}
	}
}

// PacketSent is called by paho for every packet it sends.
func (p *pinger) PacketSent() {
	p.mu.Lock()
	p.lastSent = time.Now()
	p.mu.Unlock()
}

// PacketReceived is called by paho for every packet it receives.
func (p *pinger) PacketReceived() {
	p.mu.Lock()
	p.lastRecv = time.Now()
	p.mu.Unlock()
}

// PingResp is called by paho for a PINGRESP, after PacketReceived.
func (p *pinger) PingResp() {}

// SetDebug is part of paho.Pinger; the client logs through slog instead.
func (p *pinger) SetDebug(log.Logger) {}
