package sskv

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/session"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// Condition is the condition of a SET: [Always], [IfNotExists] or
// [IfEqualOrNotExists].
type Condition uint8

// The conditions are declared one by one, not in a const block, so that
// "go doc sskv.Condition" lists each of them (it shows only the first name
// of a block).

// Always sets the key unconditionally.
const Always Condition = 0

// IfNotExists (NX) sets the key only if it does not exist.
const IfNotExists Condition = 1

// IfEqualOrNotExists (NEX) sets the key only if it does not exist or
// already holds the value being set: the way to renew a lease (with
// Expiry) without taking it from another owner.
const IfEqualOrNotExists Condition = 2

func (c Condition) String() string {
	switch c {
	case Always:
		return "Always"
	case IfNotExists:
		return "IfNotExists"
	case IfEqualOrNotExists:
		return "IfEqualOrNotExists"
	}
	return "Condition(" + strconv.Itoa(int(c)) + ")"
}

// SetOptions are the options of [Client.Set]. The zero value is a plain,
// unconditional SET with no expiry.
type SetOptions struct {
	// Condition makes the SET conditional (NX or NEX).
	Condition Condition
	// Expiry, when positive, makes the key expire that long after the SET
	// (PX), truncated to whole milliseconds. It must be at least one
	// millisecond; a negative Expiry is an error.
	Expiry time.Duration
	// FencingToken, when not zero, is sent as __ft: the key is then protected
	// by this token, or the SET must carry a token at least as new as the one
	// protecting the key.
	FencingToken hlc.Timestamp
	// Persist asks the service to persist the key to disk
	// (aio-persistence=true).
	Persist bool
}

// DelOptions are the options of [Client.Del] and [Client.VDel]. The zero
// value is a plain delete.
type DelOptions struct {
	// FencingToken, when not zero, is sent as __ft; a fenced key can only be
	// deleted with a token at least as new as its own.
	FencingToken hlc.Timestamp
}

// GetResult is the result of [Client.Get].
type GetResult struct {
	Value   []byte        // the value; nil when not Found
	Version hlc.Timestamp // the key's version; zero when not Found
	Found   bool
}

// SetResult is the result of [Client.Set].
type SetResult struct {
	// Applied is false when the Condition kept the SET from being applied;
	// that is not an error.
	Applied bool
	// Version is the key's new version when Applied, and the version of the
	// value that stayed otherwise.
	Version hlc.Timestamp
}

// DelResult is the result of [Client.Del] and [Client.VDel].
type DelResult struct {
	Deleted  bool          // the key existed (and, for VDel, held the value) and is gone
	Mismatch bool          // VDel only: the key exists with another value and was kept
	Version  hlc.Timestamp // the key's version, where it had one
}

// Get returns the value and version of key. A missing key is not an error:
// Found is false.
func (c *Client) Get(ctx context.Context, key string) (GetResult, error) {
	return c.get(ctx, nil, key)
}

func (c *Client) get(ctx context.Context, pin *Conn, key string) (GetResult, error) {
	payload := command(nil, "GET", key)
	r, err := c.do(ctx, pin, verbGet, payload, hlc.Timestamp{}, false)
	if err != nil {
		return GetResult{}, keyErr("GET", key, err)
	}
	g, err := getResult(r)
	return g, keyErr("GET", key, err)
}

// Set sets key to value under the given options. A SET whose Condition is not
// met is not an error: Applied is false.
func (c *Client) Set(ctx context.Context, key string, value []byte, opts SetOptions) (SetResult, error) {
	r, err := c.set(ctx, nil, key, value, opts)
	return r, keyErr("SET", key, err)
}

func (c *Client) set(ctx context.Context, pin *Conn, key string, value []byte, opts SetOptions) (SetResult, error) {
	var cond string
	switch opts.Condition {
	case Always:
	case IfNotExists:
		cond = "NX"
	case IfEqualOrNotExists:
		cond = "NEX"
	default:
		return SetResult{}, fmt.Errorf("%w: unknown Condition %d", ErrInvalidOption, opts.Condition)
	}
	var ms int64
	switch {
	case opts.Expiry < 0:
		return SetResult{}, fmt.Errorf("%w: negative Expiry %v", ErrInvalidOption, opts.Expiry)
	case opts.Expiry > 0 && opts.Expiry < time.Millisecond:
		return SetResult{}, fmt.Errorf("%w: Expiry %v is less than the 1ms resolution of the state store", ErrInvalidOption, opts.Expiry)
	case opts.Expiry > 0:
		ms = opts.Expiry.Milliseconds()
	}
	if err := checkToken(opts.FencingToken); err != nil {
		return SetResult{}, err
	}
	var msBuf [20]byte
	msText := strconv.AppendInt(msBuf[:0], ms, 10)
	n := 3
	if cond != "" {
		n++
	}
	if ms > 0 {
		n += 2
	}
	payload := make([]byte, 0, 64+len(key)+len(value))
	payload = resp.AppendArrayHeader(payload, n)
	payload = resp.AppendBulkString(payload, "SET")
	payload = resp.AppendBulkString(payload, key)
	payload = resp.AppendBulk(payload, value)
	if cond != "" {
		payload = resp.AppendBulkString(payload, cond)
	}
	if ms > 0 {
		payload = resp.AppendBulkString(payload, "PX")
		payload = resp.AppendBulk(payload, msText)
	}
	r, err := c.do(ctx, pin, verbSet, payload, opts.FencingToken, opts.Persist)
	if err != nil {
		return SetResult{}, err
	}
	return setResult(r)
}

// Del deletes key. Deleting a missing key is not an error: Deleted is false.
func (c *Client) Del(ctx context.Context, key string, opts DelOptions) (DelResult, error) {
	return c.del(ctx, nil, key, opts)
}

func (c *Client) del(ctx context.Context, pin *Conn, key string, opts DelOptions) (DelResult, error) {
	if err := checkToken(opts.FencingToken); err != nil {
		return DelResult{}, keyErr("DEL", key, err)
	}
	r, err := c.do(ctx, pin, verbDel, command(nil, "DEL", key), opts.FencingToken, false)
	if err != nil {
		return DelResult{}, keyErr("DEL", key, err)
	}
	d, err := delResult(verbDel, r)
	return d, keyErr("DEL", key, err)
}

// VDel deletes key only if it holds value. When it holds another value the
// key stays and Mismatch is true; neither case is an error.
func (c *Client) VDel(ctx context.Context, key string, value []byte, opts DelOptions) (DelResult, error) {
	d, err := c.vdel(ctx, nil, key, value, opts)
	return d, keyErr("VDEL", key, err)
}

func (c *Client) vdel(ctx context.Context, pin *Conn, key string, value []byte, opts DelOptions) (DelResult, error) {
	if err := checkToken(opts.FencingToken); err != nil {
		return DelResult{}, err
	}
	payload := make([]byte, 0, 32+len(key)+len(value))
	payload = resp.AppendArrayHeader(payload, 3)
	payload = resp.AppendBulkString(payload, "VDEL")
	payload = resp.AppendBulkString(payload, key)
	payload = resp.AppendBulk(payload, value)
	r, err := c.do(ctx, pin, verbVDel, payload, opts.FencingToken, false)
	if err != nil {
		return DelResult{}, err
	}
	return delResult(verbVDel, r)
}

func checkToken(t hlc.Timestamp) error {
	if t.IsZero() {
		return nil
	}
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%w: FencingToken: %w", ErrInvalidOption, err)
	}
	return nil
}

// command encodes verb, key and any further string arguments.
func command(dst []byte, verb, key string, args ...string) []byte {
	if dst == nil {
		dst = make([]byte, 0, 24+len(verb)+len(key)+16*len(args))
	}
	dst = resp.AppendArrayHeader(dst, 2+len(args))
	dst = resp.AppendBulkString(dst, verb)
	dst = resp.AppendBulkString(dst, key)
	for _, a := range args {
		dst = resp.AppendBulkString(dst, a)
	}
	return dst
}

// pending is a request waiting for its response.
type pending struct {
	ch       chan result        // receives exactly one result, from whoever removes the entry
	gen      atomic.Uint64      // connection the request was last handed to; 0 before
	cancel   context.CancelFunc // cancels the request's context
	deadline time.Time          // when its caller stops waiting
	bound    bool               // bound to a Conn: never sent on another connection
}

type result struct {
	pub *paho.Publish
	err error
	seq uint64 // notifications routed before this response
}

func (c *Client) register(p *pending) [16]byte {
	var corr [16]byte
	for {
		_, _ = rand.Read(corr[:])
		c.pmu.Lock()
		if _, dup := c.pending[corr]; !dup {
			c.pending[corr] = p
			c.pendingPeak = max(c.pendingPeak, len(c.pending))
			c.pmu.Unlock()
			return corr
		}
		c.pmu.Unlock()
	}
}

// unregister removes the entry of corr and reports whether it was there. When
// it was not, its result has been or is being sent on its channel.
func (c *Client) unregister(corr [16]byte) bool {
	c.pmu.Lock()
	_, ok := c.pending[corr]
	delete(c.pending, corr)
	c.pending = shrunk(c.pending, &c.pendingPeak)
	c.pmu.Unlock()
	return ok
}

// shrinkAbove is the size above which a map of the requests in flight is
// made anew once it is empty (see shrunk).
const shrinkAbove = 64

// shrunk returns m, or a new empty map if m is empty and held more than
// shrinkAbove entries since it was made (peak, which it then resets). A Go
// map keeps the room of the most entries it ever held: a burst of
// requests (a thousand campaigns starting at once) would otherwise leave
// its peak in the heap for good.
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	if len(m) > 0 || *peak <= shrinkAbove {
		return m
	}
	*peak = 0
	return make(map[K]V)
}

// complete delivers res to the request with correlation data corr, if it is
// still waiting.
func (c *Client) complete(corr [16]byte, res result) bool {
	c.pmu.Lock()
	p := c.pending[corr]
	delete(c.pending, corr)
	c.pending = shrunk(c.pending, &c.pendingPeak)
	c.pmu.Unlock()
	if p == nil {
		return false
	}
	p.ch <- res // buffered; only the remover sends
	return true
}

// failPending fails every request for which match is true with err, and
// returns how many it failed.
func (c *Client) failPending(match func(*pending) bool, err error) int {
	var failed []*pending
	c.pmu.Lock()
	for corr, p := range c.pending {
		if match(p) {
			delete(c.pending, corr)
			failed = append(failed, p)
		}
	}
	c.pending = shrunk(c.pending, &c.pendingPeak)
	c.pmu.Unlock()
	for _, p := range failed {
		p.ch <- result{err: err}
		p.cancel()
	}
	return len(failed)
}

// handleResponse runs on paho's receiving goroutine: it hands a response to
// its request and drops what nobody waits for.
func (c *Client) handleResponse(p *paho.Publish) {
	if p.Properties == nil || len(p.Properties.CorrelationData) != 16 {
		c.log.Debug("dropped response without valid correlation data")
		return
	}
	corr := [16]byte(p.Properties.CorrelationData)
	if !c.complete(corr, result{pub: p, seq: c.nseq.Load()}) {
		c.log.Debug("dropped response to a request no longer waiting")
	}
}

// do sends one request and returns its decoded response. It never returns
// later than ctx's deadline (or RequestTimeout when ctx has none). A request
// with a pin goes out on that connection or not at all (see Conn).
func (c *Client) do(ctx context.Context, pin *Conn, v verb, payload []byte, ft hlc.Timestamp, persist bool) (reply, error) {
	return c.doRequest(ctx, pin, v, payload, func(u paho.UserProperties) paho.UserProperties {
		u = append(u, paho.UserProperty{Key: wire.PropTimestamp, Value: c.clock.Now().String()})
		if !ft.IsZero() {
			u = append(u, paho.UserProperty{Key: wire.PropFencingToken, Value: ft.String()})
		}
		if persist {
			u = append(u, paho.UserProperty{Key: wire.PropPersistence, Value: "true"})
		}
		return u
	})
}

// doRequest is do with the request's own user properties added by props
// (tests send raw requests through it).
func (c *Client) doRequest(ctx context.Context, pin *Conn, v verb, payload []byte, props func(paho.UserProperties) paho.UserProperties) (rep reply, err error) {
	if c.cfg.Metrics.Request != nil {
		start := time.Now()
		defer func() { c.observeRequest(v, start, rep, err) }()
	}
	if c.closed.Load() {
		return reply{}, ErrClosed
	}
	if pin != nil && pin.c != c {
		return reply{}, fmt.Errorf("%w: a Conn of another client", ErrInvalidOption)
	}
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
	}
	defer cancel()
	deadline, _ := ctx.Deadline()

	p := &pending{ch: make(chan result, 1), cancel: cancel, deadline: deadline, bound: pin != nil}
	corr := c.register(p)
	if c.closed.Load() { // Close may have failed the pending requests just before
		c.unregister(corr)
		return reply{}, ErrClosed
	}
	user := make(paho.UserProperties, 0, 7)
	user = append(user,
		paho.UserProperty{Key: wire.PropProtocolVer, Value: wire.ProtocolVersion},
		paho.UserProperty{Key: wire.PropSourceID, Value: c.id},
		paho.UserProperty{Key: "$partition", Value: c.id})
	var expiry uint32
	pub := &paho.Publish{
		QoS:     1,
		Topic:   c.invokeTopic,
		Payload: payload,
		Properties: &paho.PublishProperties{
			CorrelationData: corr[:],
			ContentType:     wire.ContentType,
			ResponseTopic:   c.respTopic,
			MessageExpiry:   &expiry,
			User:            props(user),
		},
	}

	res, err := c.exchange(ctx, pin, p, corr, pub, &expiry)
	if err != nil {
		return reply{}, err
	}
	if res.err != nil {
		return reply{}, res.err
	}
	var props2 paho.UserProperties
	if res.pub.Properties != nil {
		props2 = res.pub.Properties.User
	}
	r, err := decodeResponse(res.pub.Payload, props2)
	if err != nil {
		return reply{}, err
	}
	r.seq = res.seq
	if !r.version.IsZero() {
		if _, err := c.clock.Update(r.version); err != nil {
			c.log.Debug("clock not updated from a response version", "version", r.version, "error", err)
		}
	}
	return r, nil
}

// exchange publishes pub and waits for its response. It retries the PUBLISH
// only while it is certain that the broker never got it, and, for a request
// bound to a connection (pin), never on another connection. It returns by
// ctx's deadline whatever the socket does: paho's Publish writes to the
// socket without looking at ctx, so it runs on the publisher's goroutine
// (see publisher), and a request still queued there when ctx ends is never
// sent.
func (c *Client) exchange(ctx context.Context, pin *Conn, p *pending, corr [16]byte, pub *paho.Publish, expiry *uint32) (result, error) {
	var lastGen uint64
	for {
		var st *connState
		var err error
		if pin != nil {
			if st = c.state.Load(); st.gen != pin.gen || !st.ready {
				err = pin.notSent()
			}
			if st.err != nil {
				err = st.err
			}
		} else {
			st, err = c.waitReady(ctx, lastGen)
		}
		if err == nil && ctx.Err() != nil {
			err = ctx.Err() // its caller has given up: it must not go out now
		}
		if err != nil {
			if !c.unregister(corr) {
				return <-p.ch, nil
			}
			if ctx.Err() != nil {
				err = c.ctxError(ctx, p)
			}
			return result{}, err
		}
		*expiry = expirySeconds(ctx)
		if err := checkSize(pub, st.conn); err != nil {
			if !c.unregister(corr) {
				return <-p.ch, nil
			}
			return result{}, err
		}
		p.gen.Store(st.gen)
		if pin != nil {
			c.pmu.Lock()
			c.bound[corr] = pin.seq
			c.boundPeak = max(c.boundPeak, len(c.bound))
			c.pmu.Unlock()
		}
		unbind := func() {
			if pin != nil {
				c.pmu.Lock()
				delete(c.bound, corr)
				c.bound = shrunk(c.bound, &c.boundPeak)
				c.pmu.Unlock()
			}
		}
		if !st.conn.acquireSlot(ctx) {
			// Not sent: the connection was lost, or ctx ended, while the
			// broker's Receive Maximum of requests were unacknowledged.
			unbind()
			if pin == nil && ctx.Err() == nil && !c.closed.Load() {
				lastGen = st.gen
				continue
			}
			if !c.unregister(corr) {
				return <-p.ch, nil
			}
			switch {
			case ctx.Err() != nil:
				return result{}, c.ctxError(ctx, p)
			case c.closed.Load():
				return result{}, ErrClosed
			}
			return result{}, pin.notSent()
		}
		// paho keeps a PUBLISH it has sent in its session, counted against
		// the broker's Receive Maximum, until the PUBACK (on this
		// connection or, resent, on the next), even once Publish has
		// returned on a context that ended. So the slot is held as long:
		// the publish ends with the PUBACK, the session or Close, not
		// with ctx.
		// Otherwise requests given up on under load would let more than
		// the slots into paho's quota, and the next ones would queue in
		// paho, which reports on stdout a request whose context ends
		// there. The request's deadline still goes with it, as its
		// message expiry.
		var (
			job  *pubJob
			done chan pubResult
		)
		if c.pub != nil {
			job = c.pub.publish(ctx, pub, func() {
				st.conn.releaseSlot()
				unbind()
			})
			done = job.done
		} else if done = make(chan pubResult, 1); !c.spawn(func() {
			pr, err := c.cm.Publish(c.ctx, pub)
			st.conn.releaseSlot()
			unbind()
			done <- pubResult{pr, err}
		}) {
			st.conn.releaseSlot()
			unbind()
			done <- pubResult{err: ErrClosed}
		}
		var pr *paho.PublishResponse
		select {
		case r := <-done:
			pr, err = r.pr, r.err
		case res := <-p.ch: // answered before paho reported the PUBACK
			return res, nil
		case <-ctx.Done():
			if job != nil {
				job.drop(c.pub) // not sent if it was still queued
			}
			return c.abandon(ctx, p, corr)
		}
		if errors.Is(err, errDropped) { // ctx ended while it was queued
			return c.abandon(ctx, p, corr)
		}
		if err == nil {
			break
		}
		select {
		case res := <-p.ch: // answered, or failed by Close or a lost session
			return res, nil
		default:
		}
		unsent := notSent(err) || errors.Is(err, errBoundConnGone)
		if unsent && pin == nil && !c.closed.Load() && ctx.Err() == nil {
			c.log.Debug("request not sent; waiting for the connection", "error", err)
			lastGen = st.gen
			continue
		}
		if !c.unregister(corr) {
			return <-p.ch, nil
		}
		switch {
		case c.closed.Load():
			return result{}, ErrClosed
		case unsent && pin != nil:
			return result{}, pin.notSent()
		case ctx.Err() != nil:
			return result{}, c.ctxError(ctx, p)
		case notSent(err), errors.Is(err, paho.ErrInvalidArguments):
			return result{}, err
		case pr != nil && pr.ReasonCode >= 0x80:
			return result{}, fmt.Errorf("%w: PUBACK reason 0x%02x: %w", ErrPublishRejected, pr.ReasonCode, err)
		}
		return result{}, fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	select {
	case res := <-p.ch:
		return res, nil
	case <-ctx.Done():
		return c.abandon(ctx, p, corr)
	}
}

type pubResult struct {
	pr  *paho.PublishResponse
	err error
}

// abandon ends a request whose ctx ended before its response came. A
// request that timed out on a connection that still looks up makes the
// pinger probe the connection at once, so that a dead one is replaced in a
// ping's time rather than a keep-alive's.
func (c *Client) abandon(ctx context.Context, p *pending, corr [16]byte) (result, error) {
	if !c.unregister(corr) {
		return <-p.ch, nil
	}
	if c.closed.Load() {
		return result{}, ErrClosed
	}
	if c.pinger != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		if st := c.state.Load(); st.ready && st.gen == p.gen.Load() {
			c.pinger.probe()
		}
	}
	return result{}, c.ctxError(ctx, p)
}

// ctxError is ctx's error, with what the connection did meanwhile when that
// explains the timeout: the connection the request was handed to was lost,
// or there has been no connection to hand it to.
func (c *Client) ctxError(ctx context.Context, p *pending) error {
	err := ctx.Err()
	gen := p.gen.Load()
	st := c.state.Load()
	var cause string
	if b := c.downErr.Load(); b != nil {
		cause = ": " + b.err.Error()
	}
	switch {
	case gen != 0 && (st.gen != gen || !st.ready):
		return fmt.Errorf("%w (the connection was lost while the request was in flight%s; its outcome is unknown)", err, cause)
	case gen == 0 && !st.ready:
		if b := c.lastErr.Load(); b != nil && st.gen > 0 {
			cause = "; last connection attempt: " + b.err.Error()
		}
		return fmt.Errorf("%w (not connected%s; the request was not sent)", err, cause)
	}
	return err
}

// notSent reports whether a Publish error means paho never took the message:
// the connection was down before it was added to the session.
func notSent(err error) bool {
	return errors.Is(err, autopaho.ConnectionDownError) || errors.Is(err, session.ErrNoConnection)
}

// expirySeconds is the Message Expiry of a request: the time left before
// ctx's deadline in whole seconds, rounded up, at least 1.
func expirySeconds(ctx context.Context) uint32 {
	d, ok := ctx.Deadline()
	if !ok {
		return uint32(DefaultRequestTimeout / time.Second)
	}
	return expiryFor(time.Until(d))
}
