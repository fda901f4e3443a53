package sskv_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A TLS mismatch with the local store, either way, fails Dial at once with
// ErrTLSMismatch and a message that says what to change. (It used to retry
// until the deadline, then report a bare EOF.)
func TestTLSMismatch(t *testing.T) {
	cert, pool, err := testtls.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	srv := startStore(t, localstore.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	for _, tc := range []struct {
		name string
		cfg  sskv.Config
		want string
	}{
		{"plain client, TLS port", sskv.Config{Addr: srv.TLSAddr()}, "speaks TLS: set Config.TLS"},
		{"TLS client, plain port", sskv.Config{Addr: srv.Addr(), TLS: &tls.Config{RootCAs: pool}}, "does not speak TLS: leave Config.TLS unset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 10 * time.Second
			took, err := dialFast(t, timeout, tc.cfg)
			t.Logf("%v after %v", err, took)
			if !errors.Is(err, sskv.ErrTLSMismatch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial = %v; want ErrTLSMismatch saying %q", err, tc.want)
			}
			if errors.Is(err, context.DeadlineExceeded) || took > timeout/2 {
				t.Errorf("Dial took %v of its %v to fail", took, timeout)
			}
		})
	}
	// The right pairs connect.
	for _, cfg := range []sskv.Config{{Addr: srv.Addr()}, {Addr: srv.TLSAddr(), TLS: &tls.Config{RootCAs: pool}}} {
		cfg.ClientID = testID(t)
		c, err := sskv.Dial(testCtx(t), cfg)
		if err != nil {
			t.Fatalf("Dial %s (TLS %v): %v", cfg.Addr, cfg.TLS != nil, err)
		}
		_ = c.Close()
	}
}

// A server that closes the connection on CONNECT but speaks no TLS (a
// broker starting, or shedding load) is retried as before, not taken for a
// TLS port.
func TestEarlyCloseIsRetried(t *testing.T) {
	b := startFakeBroker(t, func(c net.Conn) { _, _ = readConnect(c) })
	took, err := dialFast(t, 500*time.Millisecond, sskv.Config{Addr: b.Addr()})
	if errors.Is(err, sskv.ErrTLSMismatch) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v after %v; want the deadline, retrying", err, took)
	}
	if n := b.accepted(); n < 2 {
		t.Fatalf("%d attempts; want retries", n)
	}
}
