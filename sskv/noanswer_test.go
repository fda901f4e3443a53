package sskv_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsslock/dsslock/faultproxy"
	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A server that accepts the TCP connection and never answers (no CONNACK,
// or no TLS handshake) fails a FailFast Dial after HandshakeTimeout with
// ErrNoAnswer, saying so, rather than after the attempt's 6 s with a bare
// "context deadline exceeded".
func TestHandshakeTimeoutNamesSilentServer(t *testing.T) {
	silent := startFakeBroker(t, drain)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		want string
	}{
		{"plain", nil, "connected to " + silent.Addr() + ", but no MQTT answer within 1s (no CONNACK to CONNECT)"},
		{"TLS", &tls.Config{InsecureSkipVerify: true}, "connected to " + silent.Addr() + ", but no TLS answer within 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			took, err := dialFast(t, 10*time.Second, sskv.Config{Addr: silent.Addr(), TLS: tc.tls, FailFast: true, HandshakeTimeout: time.Second})
			t.Logf("%v after %v", err, took)
			if !errors.Is(err, sskv.ErrNoAnswer) || !strings.Contains(err.Error(), tc.want) || strings.Count(err.Error(), "sskv:") != 1 {
				t.Errorf("Dial = %v; want ErrNoAnswer saying %q", err, tc.want)
			}
			if took > 3*time.Second {
				t.Errorf("Dial took %v to fail; want about the HandshakeTimeout, 1s", took)
			}
		})
	}
	// Without HandshakeTimeout, the attempt's own bound (here
	// RequestTimeout, shorter than KeepAlive+PingTimeout) names it too.
	took, err := dialFast(t, 10*time.Second, sskv.Config{Addr: silent.Addr(), FailFast: true, RequestTimeout: 1500 * time.Millisecond})
	if !errors.Is(err, sskv.ErrNoAnswer) || !strings.Contains(err.Error(), "no MQTT answer within 1.5s") {
		t.Errorf("Dial without HandshakeTimeout = %v after %v; want ErrNoAnswer within 1.5s", err, took)
	}
	// Without FailFast, Dial keeps trying (a stalled broker may recover):
	// its context ends it, with the last attempt's cause.
	took, err = dialFast(t, 1500*time.Millisecond, sskv.Config{Addr: silent.Addr(), HandshakeTimeout: 200 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no MQTT answer within 200ms") {
		t.Errorf("Dial without FailFast = %v after %v; want its deadline, with the cause", err, took)
	}
	if _, err := dialFast(t, time.Second, sskv.Config{Addr: silent.Addr(), HandshakeTimeout: -time.Second}); !errors.Is(err, sskv.ErrConfig) {
		t.Errorf("negative HandshakeTimeout: %v", err)
	}
}

// HandshakeTimeout bounds the handshakes only: a connection that answered
// lives on, idle, well past it, over plain MQTT and over TLS.
func TestHandshakeTimeoutSparesLiveConnection(t *testing.T) {
	cert, pool, err := testtls.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	srv := startStore(t, localstore.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	const ht = 300 * time.Millisecond // long enough for a handshake on a loaded machine
	for _, cfg := range []sskv.Config{{Addr: srv.Addr()}, {Addr: srv.TLSAddr(), TLS: &tls.Config{RootCAs: pool}}} {
		var downs atomic.Int32
		cfg.ClientID, cfg.HandshakeTimeout, cfg.FailFast = testID(t), ht, true
		cfg.Metrics.ConnectionDown = func(uint64, error) { downs.Add(1) }
		c, err := sskv.Dial(testCtx(t), cfg)
		if err != nil {
			t.Fatalf("Dial %s: %v", cfg.Addr, err)
		}
		// Idle for many HandshakeTimeouts: a deadline left on the socket
		// would end the connection at the first of them.
		<-time.After(4 * ht)
		if _, err := c.Set(testCtx(t), "k", []byte("v"), sskv.SetOptions{}); err != nil {
			t.Errorf("Set after %v idle: %v", 4*ht, err)
		}
		if n := downs.Load(); n != 0 {
			t.Errorf("%s: the connection went down %d times", cfg.Addr, n)
		}
		_ = c.Close()
	}
}

// HandshakeTimeout bounds Dial's attempts only: a reconnection to a broker
// that answers slower than it (here an 800 ms round trip, with a
// HandshakeTimeout of 300 ms) still gets through.
func TestHandshakeTimeoutSparesReconnect(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	p := startProxy(t, srv, faultproxy.Options{})
	var ups atomic.Int32
	var noAnswer atomic.Int32
	c := dial(t, srv, viaProxy(p), func(cfg *sskv.Config) {
		cfg.HandshakeTimeout, cfg.FailFast = 300*time.Millisecond, true
		cfg.Metrics.ConnectionUp = func(uint64) { ups.Add(1) }
		cfg.Metrics.ConnectFailed = func(err error) {
			if errors.Is(err, sskv.ErrNoAnswer) {
				noAnswer.Add(1)
			}
		}
	})
	p.SetDelay(400 * time.Millisecond)
	p.Cut()
	if _, err := c.Set(testCtx(t), "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatalf("Set after the reconnect: %v", err)
	}
	if n, m := ups.Load(), noAnswer.Load(); n < 2 || m != 0 {
		t.Errorf("%d connections, %d attempts cut short by HandshakeTimeout; want a reconnect, none cut short", n, m)
	}
}
