package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/internal/testtls"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// processTimeout bounds each wait on the store process: generous, as the
// machine may be slow and busy.
const processTimeout = 60 * time.Second

// pki is a CA, a server certificate for 127.0.0.1 and client certificates
// with CommonNames alice and bob, all as PEM files.
type pki struct {
	caCert, serverCert, serverKey string
	pool                          *x509.CertPool
	clients                       map[string]tls.Certificate
}

func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	ca, err := testtls.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{pool: ca.Pool(), clients: map[string]tls.Certificate{}}
	p.caCert = writeFile(t, dir, "ca.pem", string(ca.PEM()))
	server, err := ca.Issue("server", true)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := testtls.PEM(server)
	if err != nil {
		t.Fatal(err)
	}
	p.serverCert = writeFile(t, dir, "server.pem", string(certPEM))
	p.serverKey = writeFile(t, dir, "server.key", string(keyPEM))
	for _, cn := range []string{"alice", "bob"} {
		if p.clients[cn], err = ca.Issue(cn, false); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// storeBinary builds the program once for the tests.
func storeBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "statestore-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "statestore")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

var listening = regexp.MustCompile(`msg=listening (tls_)?addr=(\S+)`)

// storeProc is a running statestore process.
type storeProc struct {
	cmd           *exec.Cmd
	addr, tlsAddr string
	exited        chan struct{}
	stderr        strings.Builder // once exited is closed
	err           error           // once exited is closed
}

// startProc starts the program with args and waits until it listens (on
// as many listeners as want); it is stopped with SIGTERM at the end of the
// test, and must then exit cleanly.
func startProc(t *testing.T, want int, args ...string) *storeProc {
	t.Helper()
	p := &storeProc{cmd: exec.Command(storeBinary(t), args...), exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [2]string, 2)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteString(line + "\n")
			if m := listening.FindStringSubmatch(line); m != nil {
				addrs <- [2]string{m[1], m[2]}
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
			if p.err != nil {
				t.Errorf("statestore did not exit cleanly: %v\n%s", p.err, p.stderr.String())
			}
		case <-time.After(processTimeout):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("statestore did not stop on SIGTERM")
		}
	})
	for range want {
		select {
		case a := <-addrs:
			if a[0] == "tls_" {
				p.tlsAddr = a[1]
			} else {
				p.addr = a[1]
			}
		case <-p.exited:
			t.Fatalf("statestore exited: %v\n%s", p.err, p.stderr.String())
		case <-time.After(processTimeout):
			t.Fatal("statestore did not listen")
		}
	}
	return p
}

// dialAs dials the store with cfg, failing fast: a refusal is an error.
func dialAs(t *testing.T, cfg sskv.Config) (*sskv.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	defer cancel()
	cfg.FailFast = true
	c, err := sskv.Dial(ctx, cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// tryLock takes the lock name on c with dsslock's lock and returns
// TryLock's error (false without one fails the test: nobody holds it).
func tryLock(t *testing.T, c *sskv.Client, name string) error {
	t.Helper()
	l, err := lock.New(c, lock.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	defer cancel()
	ok, err := l.TryLock(ctx)
	if err == nil && !ok {
		t.Fatalf("TryLock %s: not acquired", name)
	}
	return err
}

// TestStandaloneTenants runs the program as a user would, with users,
// service account tokens and key prefixes on the plain listener and client
// certificates on the TLS one: an unauthenticated client, a wrong password
// and a certificate-less TLS client are refused, and each tenant takes
// locks under its own prefix only.
func TestStandaloneTenants(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t, dir)
	users := writeFile(t, dir, "users.txt", "# name:password\nalice:alice-pw\n")
	tokens := writeFile(t, dir, "tokens.txt", "bob: bob-token\n")
	bobToken := writeFile(t, dir, "bob.token", "bob-token")

	p := startProc(t, 1, "-listen", "127.0.0.1:0", "-users", users, "-sat-tokens", tokens,
		"-key-prefix", "alice=a/", "-key-prefix", "bob=b/")
	var ce *sskv.ConnectError
	if _, err := dialAs(t, sskv.Config{Addr: p.addr}); !errors.As(err, &ce) || ce.ReasonCode != 0x86 {
		t.Errorf("anonymous client: %v; want CONNACK 0x86, bad user name or password", err)
	}
	if _, err := dialAs(t, sskv.Config{Addr: p.addr, Username: "alice", Password: []byte("bob-pw")}); !errors.As(err, &ce) || ce.ReasonCode != 0x86 {
		t.Errorf("wrong password: %v; want CONNACK 0x86", err)
	}
	a, err := dialAs(t, sskv.Config{Addr: p.addr, Username: "alice", Password: []byte("alice-pw")})
	if err != nil {
		t.Fatalf("alice: %v", err)
	}
	b, err := dialAs(t, sskv.Config{Addr: p.addr, SATFile: bobToken})
	if err != nil {
		t.Fatalf("bob (SAT): %v", err)
	}
	if err := tryLock(t, a, "a/lock"); err != nil {
		t.Errorf("alice's lock: %v", err)
	}
	if err := tryLock(t, b, "b/lock"); err != nil {
		t.Errorf("bob's lock: %v", err)
	}
	if err := tryLock(t, a, "b/lock"); !errors.Is(err, sskv.ErrNotAuthorized) {
		t.Errorf("alice's lock on bob's key: %v; want not authorized", err)
	}

	// Client certificates: the user is the certificate's CommonName.
	q := startProc(t, 1, "-listen", "-", "-tls-listen", "127.0.0.1:0", "-tls-cert", pki.serverCert, "-tls-key", pki.serverKey,
		"-client-ca", pki.caCert, "-key-prefix", "alice=a/", "-key-prefix", "bob=b/")
	if _, err := dialAs(t, sskv.Config{Addr: q.tlsAddr, TLS: &tls.Config{RootCAs: pki.pool}}); err == nil {
		t.Error("a TLS client without a certificate was let in")
	}
	withCert := func(cn string) *tls.Config {
		return &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clients[cn]}}
	}
	ca, err := dialAs(t, sskv.Config{Addr: q.tlsAddr, TLS: withCert("alice")})
	if err != nil {
		t.Fatalf("alice's certificate: %v", err)
	}
	if err := tryLock(t, ca, "a/lock"); err != nil {
		t.Errorf("alice's lock: %v", err)
	}
	if err := tryLock(t, ca, "b/lock"); !errors.Is(err, sskv.ErrNotAuthorized) {
		t.Errorf("alice's lock on bob's key: %v; want not authorized", err)
	}
}

// TestStandaloneRefusesOpenNetwork: asked to listen on every interface
// without authentication, the program exits at once, saying why and what
// to do, and listens nowhere.
func TestStandaloneRefusesOpenNetwork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, storeBinary(t), "-listen", "0.0.0.0:0").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v; want status 1\n%s", err, out)
	}
	for _, want := range []string{"without authentication", "-users", "-allow-anonymous-network"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "msg=listening") {
		t.Errorf("it listened:\n%s", out)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
