package main

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// silentListener accepts TCP connections and never says a word, as a port
// forward to nothing, or a server of another protocol that waits for its
// own greeting, does.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// Each way a connection fails is named, in its own words, within about a
// second (the -timeout is the default 10 s): a server that accepts TCP but
// never answers MQTT (it used to be "context deadline exceeded" after
// 6 s), a refused connection, a TLS mismatch either way, bad credentials.
func TestDialFailuresNamed(t *testing.T) {
	cert, _, err := testtls.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	srv := startStore(t, localstore.Config{
		TLS:   &tls.Config{Certificates: []tls.Certificate{cert}},
		Users: map[string]string{"alice": "secret"},
	})
	dir := t.TempDir()
	wrongPW := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrongPW, []byte("guess"), 0o600); err != nil {
		t.Fatal(err)
	}
	silent, refused := silentListener(t), closedAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		want []string // in stderr, in this order
	}{
		{"silent server", []string{"-addr", silent},
			[]string{"sskv: dial " + silent + ": connected to " + silent + ", but no MQTT answer within 1s", "longer -handshake-timeout"}},
		{"silent server, TLS", []string{"-addr", silent, "-tls", "-insecure-skip-verify"},
			[]string{"sskv: dial " + silent + ": connected to " + silent + ", but no TLS answer within 1s", "longer -handshake-timeout"}},
		{"silent server, -handshake-timeout", []string{"-addr", silent, "-handshake-timeout", "300ms"},
			[]string{"but no MQTT answer within 300ms", "(now 300ms)"}},
		{"refused", []string{"-addr", refused},
			[]string{"sskv: dial " + refused + ": ", "connection refused", "nothing listens on " + refused}},
		{"TLS client, plain server", []string{"-addr", srv.Addr(), "-tls", "-insecure-skip-verify"},
			[]string{"TLS mismatch: the server at " + srv.Addr() + " does not speak TLS", "no sskv -tls"}},
		{"plain client, TLS server", []string{"-addr", srv.TLSAddr()},
			[]string{"TLS mismatch: the server at " + srv.TLSAddr() + " speaks TLS", "sskv -tls"}},
		{"no credentials", []string{"-addr", srv.Addr()},
			[]string{"broker refused the connection: reason 0x86 (bad user name or password)", "check the credentials: -user and -password-file"}},
		{"untrusted certificate", []string{"-addr", srv.TLSAddr(), "-tls"},
			[]string{"sskv: dial " + srv.TLSAddr() + ": ", "certificate signed by unknown authority", "give the CA", "-ca"}},
		{"unknown host", []string{"-addr", "nosuchhost.invalid:1883"},
			[]string{"sskv: dial nosuchhost.invalid:1883: ", "no such host"}},
		{"wrong password", []string{"-addr", srv.Addr(), "-user", "alice", "-password-file", wrongPW},
			[]string{"broker refused the connection: reason 0x86 (bad user name or password)", "check the credentials"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			o := sskvRun(t, append(tc.args, "get", "k")...)
			took := time.Since(start)
			t.Logf("after %v:\n%s", took, o.stderr)
			rest := o.stderr
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("stderr %q; want %q (in order: %q)", o.stderr, w, tc.want)
				}
				rest = rest[i+len(w):]
			}
			if o.code != exitError || o.stdout != "" {
				t.Errorf("exit %d, stdout %q; want exit 1", o.code, o.stdout)
			}
			if strings.Contains(o.stderr, "deadline exceeded") || strings.Contains(o.stderr, "sskv: sskv:") {
				t.Errorf("stderr %q: want the cause alone, said once", o.stderr)
			}
			if took > 3*time.Second {
				t.Errorf("reported after %v; want about a second", took)
			}
		})
	}
	// The right credentials, on the right port, connect.
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sskvRun(t, "-addr", srv.Addr(), "-user", "alice", "-password-file", pw, "get", "k").want(t, exitNotMet, "", "")
}
