package localstore_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"

	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func netDial(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }

func TestUsernamePassword(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"app": "s3cret"}})
	if _, err := dial(t, srv, connOpts{}); err == nil {
		t.Fatal("anonymous client accepted")
	}
	if _, err := dial(t, srv, connOpts{username: "app", password: "wrong"}); err == nil {
		t.Fatal("wrong password accepted")
	}
	c := connect(t, srv, connOpts{username: "app", password: "s3cret"})
	mustPayload(t, c.do(cmd("SET", "k", "v")), okResp)
}

func TestSATAuth(t *testing.T) {
	srv := startStore(t, localstore.Config{SATTokens: map[string]string{"token-abc": "pod-a"},
		KeyPrefixes: map[string][]string{"pod-a": {"a/"}}})
	if _, err := dial(t, srv, connOpts{satToken: "token-wrong"}); err == nil {
		t.Fatal("unknown token accepted")
	}
	if _, err := dial(t, srv, connOpts{}); err == nil {
		t.Fatal("client without token accepted")
	}
	c := connect(t, srv, connOpts{satToken: "token-abc"})
	mustPayload(t, c.do(cmd("SET", "a/k", "v")), okResp)
	mustPayload(t, c.do(cmd("SET", "b/k", "v")), errPayload(wire.MsgNotAuthorized))
}

func TestKeyACL(t *testing.T) {
	srv := startStore(t, localstore.Config{
		Users:       map[string]string{"north": "n", "south": "s"},
		KeyPrefixes: map[string][]string{"north": {"north/", "shared/"}, "south": {"south/"}},
	})
	n := connect(t, srv, connOpts{username: "north", password: "n"})
	s := connect(t, srv, connOpts{username: "south", password: "s"})
	mustPayload(t, n.do(cmd("SET", "north/x", "1")), okResp)
	mustPayload(t, n.do(cmd("SET", "shared/x", "1")), okResp)
	for _, req := range []request{
		cmd("GET", "north/x"), cmd("SET", "north/x", "2"), cmd("DEL", "north/x"),
		cmd("VDEL", "north/x", "1"), cmd("KEYNOTIFY", "north/x"),
	} {
		mustPayload(t, s.do(req), errPayload(wire.MsgNotAuthorized))
	}
	mustPayload(t, n.do(cmd("GET", "north/x")), "$1\r\n1\r\n")
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	srv := startStore(t, localstore.Config{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	c := connect(t, srv, connOpts{addr: srv.TLSAddr(), tlsConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}})
	mustPayload(t, c.do(cmd("SET", "k", "v")), okResp)
	if _, err := dial(t, srv, connOpts{addr: srv.TLSAddr(), tlsConfig: &tls.Config{ServerName: "localhost"}}); err == nil {
		t.Fatal("TLS with an unknown CA: no error")
	}
}

// selfSigned makes a certificate for localhost and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	cert, pool, err := testtls.SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	return cert, pool
}
