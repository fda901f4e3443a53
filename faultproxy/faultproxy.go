package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a [Proxy]. The zero value is a plain proxy with the
// operating system's socket buffers.
type Options struct {
	// BufferSize, when positive, sets the send and receive buffers
	// (SO_SNDBUF, SO_RCVBUF) of both sockets of every connection, and bounds
	// what the proxy holds per direction of a frozen or delayed connection
	// (default 64 KiB). Small buffers make a writer to a frozen connection
	// block soon. The kernel
	// may round the size up (Linux doubles it and has a minimum). On
	// loopback, whose segments are 64 KiB, sizes below about 32 KiB can
	// stall a connection in the kernel's zero-window probing for seconds:
	// use 32 KiB or more.
	BufferSize int
}

// Proxy is a TCP proxy with fault injection. Its methods are safe for
// concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	opts   Options

	mu          sync.Mutex
	links       map[*link]struct{}
	closed      bool
	partitioned bool // new connections are closed at once (Partition)
	wg          sync.WaitGroup

	accepted atomic.Int64
	delay    atomic.Pointer[delayState]
}

// delayState is the delay in effect; changed is closed when it is replaced.
type delayState struct {
	d       time.Duration
	changed chan struct{}
}

// Start listens on 127.0.0.1 (a free port) and forwards every connection to
// target ("host:port").
func Start(target string, opts Options) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, opts: opts, links: make(map[*link]struct{})}
	p.delay.Store(&delayState{changed: make(chan struct{})})
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port": connect here instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted is the number of client connections accepted so far.
func (p *Proxy) Accepted() int { return int(p.accepted.Load()) }

// Links is the number of proxied connections open now: a connection stops
// counting as soon as the proxy closes it, which it does when either of its
// sides is closed (with a delay set, once the close has been delayed too).
func (p *Proxy) Links() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Blackhole freezes every connection open now: from now on the proxy
// forwards nothing on them in either direction, but keeps both sockets
// open, as a dead NAT mapping or a frozen peer would. It goes on reading
// each side until it holds Options.BufferSize bytes (default 64 KiB) per
// direction, so that the peers' writes block once those and the socket
// buffers are full; it still notices a side that closes, and then closes
// the connection. Connections accepted later are forwarded normally (a new
// connection takes a new path). [Proxy.Heal] resumes the frozen
// connections, delivering what they held.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.freeze()
	}
}

// SetDelay adds latency: from now on every chunk of bytes the proxy
// forwards, in either direction, on the connections open now and on later
// ones, is delivered d after the proxy read it. A request and its response
// thus take 2d longer. Bytes stay in order, and a side's clean close (EOF)
// reaches the other side d later, after the bytes before it; a side that
// fails (a reset) ends the connection at once. The new d also applies to
// the chunks already waiting, each delivered once d has passed since it was
// read: SetDelay(0), or a negative d, removes the delay and delivers them at
// once.
//
// The proxy holds at most Options.BufferSize bytes (default 64 KiB) per
// direction of a connection, the bytes in flight, so a delay also bounds a
// connection's throughput to about that much per d, as a TCP window does.
// [Proxy.Blackhole], [Proxy.Cut] and [Proxy.Close] still act at once: a
// frozen connection delivers nothing, due or not, and Close does not wait
// for the bytes in flight.
func (p *Proxy) SetDelay(d time.Duration) {
	d = max(d, 0)
	old := p.delay.Swap(&delayState{d: d, changed: make(chan struct{})})
	close(old.changed)
}

// Heal resumes every frozen connection, and ends a partition.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = false
	for l := range p.links {
		l.resume()
	}
}

// Partition cuts every connection open now, as Cut does, and until
// [Proxy.Heal] closes each new connection as soon as it is accepted: the
// client finds the target unreachable and keeps trying to reconnect, as
// when its network or the target is down.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.partitioned = true
	p.mu.Unlock()
	p.Cut()
}

// Cut closes every connection open now, both sides. The proxy goes on
// accepting new connections.
func (p *Proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Close stops accepting, closes every connection and waits for all of the
// proxy's goroutines to end. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target for the accepted connection c and forwards between
// them until either side ends.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	hold := p.opts.BufferSize
	if hold <= 0 {
		hold = 64 << 10
	}
	// The link is registered before the target is dialled, so that Cut and
	// Close also end a connection still being set up.
	dialCtx, cancelDial := context.WithCancel(context.Background())
	defer cancelDial()
	l := &link{p: p, client: c, hold: hold, done: make(chan struct{}), cancelDial: cancelDial}
	p.mu.Lock()
	if p.closed || p.partitioned {
		p.mu.Unlock()
		_ = c.Close()
		return
	}
	p.links[l] = struct{}{}
	// Counted once registered: a Cut after Accepted has counted a
	// connection always ends it.
	p.accepted.Add(1)
	p.mu.Unlock()
	defer func() {
		l.close()
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()

	var d net.Dialer
	s, err := d.DialContext(dialCtx, "tcp", p.target)
	if err != nil {
		return
	}
	if !l.setServer(s) {
		return // cut while dialling
	}
	p.setBuffers(c)
	p.setBuffers(s)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pipe(s, c) }()
	go func() { defer wg.Done(); l.pipe(c, s) }()
	wg.Wait()
}

func (p *Proxy) setBuffers(c net.Conn) {
	if p.opts.BufferSize <= 0 {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(p.opts.BufferSize)
		_ = tc.SetWriteBuffer(p.opts.BufferSize)
	}
}

// link is one proxied connection.
type link struct {
	p      *Proxy
	client net.Conn
	server net.Conn // nil while the target is dialled; guarded by mu
	hold   int

	mu     sync.Mutex
	frozen chan struct{} // non-nil while frozen; closed by resume

	closeOnce  sync.Once
	done       chan struct{} // closed when the link is closed
	cancelDial context.CancelFunc
}

func (l *link) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frozen == nil {
		l.frozen = make(chan struct{})
	}
}

func (l *link) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.frozen != nil {
		close(l.frozen)
		l.frozen = nil
	}
}

// gate returns the channel to wait on before forwarding, or nil when the
// link is not frozen.
func (l *link) gate() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.frozen
}

func (l *link) close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		close(l.done)
		s := l.server
		l.mu.Unlock()
		l.cancelDial()
		_ = l.client.Close()
		if s != nil {
			_ = s.Close()
		}
	})
}

// setServer attaches the server side; it reports false, and closes s, when
// the link has been closed meanwhile.
func (l *link) setServer(s net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		_ = s.Close()
		return false
	default:
	}
	l.server = s
	return true
}

// chunk is what one read returned, with the time it was read.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies from src to dst. Each chunk it reads is written out once the
// delay in effect has passed since it was read, and the link is not
// frozen. While it waits, and while the link is frozen, it goes on reading
// into its held chunks, up to l.hold bytes, and forwards nothing; the held
// chunks are written out, in order, when they are due. A reader and a
// writer goroutine per direction let the proxy notice a side that closes
// while it holds data for a frozen or delayed link.
func (l *link) pipe(dst, src net.Conn) {
	var (
		mu      sync.Mutex
		held    []chunk
		size    int // bytes in held
		srcDone bool
		srcEnd  time.Time                // when src ended
		ready   = make(chan struct{}, 1) // something to write, or src ended
		room    = make(chan struct{}, 1) // held shrank
	)
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // writer
		defer wg.Done()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		var out net.Buffers
		for {
			select {
			case <-ready:
			case <-l.done:
				return
			}
			for {
				if g := l.gate(); g != nil {
					mu.Lock()
					ended := srcDone
					mu.Unlock()
					if ended {
						// src ended and the link is frozen (it froze
						// while its close was delayed): as in the reader,
						// the link ends at once.
						l.close()
						return
					}
					select {
					case <-g:
						continue
					case <-l.done:
						return
					}
				}
				delay := l.p.delay.Load()
				now := time.Now()
				var wait time.Duration
				out = out[:0]
				mu.Lock()
				n := 0
				for _, c := range held {
					if w := c.at.Add(delay.d).Sub(now); w > 0 {
						wait = w
						break
					}
					out = append(out, c.b)
					size -= len(c.b)
					n++
				}
				rest := copy(held, held[n:])
				clear(held[rest:])
				held = held[:rest]
				end := false
				if srcDone && rest == 0 {
					// The close is delivered after the bytes before it,
					// and as late.
					if w := srcEnd.Add(delay.d).Sub(now); w > 0 {
						wait = w
					} else {
						end = true
					}
				}
				mu.Unlock()
				if n > 0 {
					signal(room)
					// WriteTo consumes out, so keep its backing array.
					bufs := out
					if _, err := bufs.WriteTo(dst); err != nil {
						l.close()
						return
					}
					clear(out)
					continue
				}
				if wait > 0 {
					timer.Reset(wait)
					select {
					case <-timer.C:
					case <-delay.changed:
					case <-l.done:
						return
					}
					continue
				}
				if end {
					l.close()
					return
				}
				break
			}
		}
	}()

	buf := make([]byte, 32<<10)
	for {
		mu.Lock()
		free := l.hold - size
		mu.Unlock()
		if free <= 0 {
			select {
			case <-room:
				continue
			case <-l.done:
				wg.Wait()
				return
			}
		}
		n, err := src.Read(buf[:min(free, len(buf))])
		mu.Lock()
		if n > 0 {
			held = append(held, chunk{b: bytes.Clone(buf[:n]), at: time.Now()})
			size += n
		}
		if err != nil {
			srcDone, srcEnd = true, time.Now()
		}
		mu.Unlock()
		signal(ready)
		if err != nil {
			if !errors.Is(err, io.EOF) || l.gate() != nil {
				// A side that fails, or ends while the link is frozen,
				// ends the link at once; after a clean end the writer
				// first delivers what is held, when it is due.
				l.close()
			}
			wg.Wait()
			return
		}
	}
}
