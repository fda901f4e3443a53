package sskv

import (
	"context"
	"net"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
)

// Test hooks. They exist only in the test binary.

// SetInvokeTopicForTest makes c send its requests to topic instead of the
// state store, so that a test can act as the service.
func SetInvokeTopicForTest(c *Client, topic string) { c.invokeTopic = topic }

// RawReply is a decoded response to a raw request.
type RawReply struct {
	Kind    string
	Str     string
	Int     int64
	Version hlc.Timestamp
}

// DoRawForTest sends payload as a request with the standard properties plus
// props; withTS adds a fresh __ts unless props has one.
func DoRawForTest(ctx context.Context, c *Client, payload []byte, props map[string]string, withTS bool) (RawReply, error) {
	r, err := c.doRequest(ctx, nil, verbRaw, payload, func(u paho.UserProperties) paho.UserProperties {
		if _, ok := props["__ts"]; withTS && !ok {
			u = append(u, paho.UserProperty{Key: "__ts", Value: c.clock.Now().String()})
		}
		for k, v := range props {
			u = append(u, paho.UserProperty{Key: k, Value: v})
		}
		return u
	})
	if err != nil {
		return RawReply{}, err
	}
	return RawReply{Kind: r.Kind.String(), Str: string(r.Str), Int: r.Int, Version: r.version}, nil
}

// Command encodes args as a RESP request.
func Command(args ...string) []byte {
	b := make([][]byte, len(args))
	for i, a := range args {
		b[i] = []byte(a)
	}
	return resp.AppendCommand(nil, b...)
}

// ReconnectBackoffForTest exposes the reconnect delay function.
func ReconnectBackoffForTest(minD, maxD time.Duration) func(int) time.Duration {
	return reconnectBackoff(minD, maxD)
}

// ConfigFromLookupForTest is ConfigFromEnv with its own environment.
func ConfigFromLookupForTest(env map[string]string) (Config, error) {
	return configFromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
}

// ClockForTest returns the client's clock.
func ClockForTest(c *Client) *hlc.Clock { return c.clock }

// SocketForTest returns the TCP socket of c's current connection (or last
// connection attempt), or nil.
func SocketForTest(c *Client) net.Conn {
	if mc := c.conn.Load(); mc != nil {
		return mc.raw
	}
	return nil
}

// WriteBlockedForTest reports how long the write in progress on c's
// connection has been blocked (0 when none is).
func WriteBlockedForTest(c *Client) time.Duration {
	if mc := c.conn.Load(); mc != nil {
		if t := mc.flushStart.Load(); t != 0 {
			return time.Since(time.Unix(0, t))
		}
	}
	return 0
}

// PendingForTest is the number of requests waiting for a response.
func PendingForTest(c *Client) int {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return len(c.pending)
}

// SetSyncHookForTest makes c call f before each KEYNOTIFY of a watch's sync
// (the first one at Watch, and each after a reconnect).
func SetSyncHookForTest(c *Client, f func(key string)) { c.testHookSync = f }

// RegisteredForTest reports whether c has a registration for key.
func RegisteredForTest(c *Client, key string) bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.regs[key] != nil
}

// KnownForTest returns the version of key that c's registration knows, and
// whether it is resyncing.
func KnownForTest(c *Client, key string) (hlc.Timestamp, bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	reg := c.regs[key]
	if reg == nil {
		return hlc.Timestamp{}, false
	}
	return reg.known.version, reg.resyncing
}

// PublisherState is what the client's publisher is doing (see publisher).
type PublisherState struct {
	Queued  int    // requests waiting for the writer
	Tracked int    // requests in paho's session, not yet acknowledged
	Running bool   // the writer's goroutine runs
	Sends   uint64 // requests handed to paho so far
	Dropped uint64 // requests dropped unsent so far
}

// PublisherStateForTest reports what c's publisher is doing.
func PublisherStateForTest(c *Client) PublisherState {
	p := c.pub
	p.mu.Lock()
	defer p.mu.Unlock()
	return PublisherState{Queued: int(p.waiting.Load()), Tracked: len(p.tracked), Running: p.running, Sends: p.sends.Load(), Dropped: p.dropped.Load()}
}
