package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/storetest"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestMain(m *testing.M) {
	if os.Getenv("SSKV_TEST_MAIN") == "1" {
		// The test binary runs as sskv itself, for tests that need a
		// process of their own (signals).
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

func startStore(t *testing.T, cfg localstore.Config) *localstore.Server {
	t.Helper()
	srv, err := localstore.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

type outcome struct {
	code           int
	stdout, stderr string
}

// sskvIn runs the command line args with stdin and returns what it did.
func sskvIn(t *testing.T, stdin io.Reader, args ...string) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stdout, stderr := newSyncBuffer(), newSyncBuffer() // "sskv lock" commands write concurrently
	code := run(ctx, args, stdin, stdout, stderr)
	return outcome{code, stdout.String(), stderr.String()}
}

func sskvRun(t *testing.T, args ...string) outcome {
	t.Helper()
	return sskvIn(t, nil, args...)
}

// want fails the test unless o has code and stdout, and stderr contains
// stderrPart.
func (o outcome) want(t *testing.T, code int, stdout, stderrPart string) {
	t.Helper()
	if o.code != code || o.stdout != stdout || !strings.Contains(o.stderr, stderrPart) {
		t.Fatalf("got exit %d, stdout %q, stderr %q;\nwant exit %d, stdout %q, stderr containing %q",
			o.code, o.stdout, o.stderr, code, stdout, stderrPart)
	}
}

var okLine = regexp.MustCompile(`^OK (\d{15}:\d{5}:statestore)\n$`)

// setOK runs a set that must be applied and returns the version it printed.
func setOK(t *testing.T, args ...string) string {
	t.Helper()
	o := sskvRun(t, args...)
	m := okLine.FindStringSubmatch(o.stdout)
	if o.code != exitOK || m == nil || o.stderr != "" {
		t.Fatalf("%q: exit %d, stdout %q, stderr %q; want OK <version>", args, o.code, o.stdout, o.stderr)
	}
	if _, err := hlc.Parse(m[1]); err != nil {
		t.Fatalf("printed version %q: %v", m[1], err)
	}
	return m[1]
}

func TestGetSetDel(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	// A missing key: get says it in del's words, on stderr, since its
	// stdout is the value alone; the exit status tells a script.
	if o := sskvRun(t, cmd("get", "-raw", "k")...); o.code != exitNotMet || o.stdout != "" || o.stderr != "NOT FOUND\n" {
		t.Fatalf("get of a missing key: exit %d, stdout %q, stderr %q; want 3, nothing, NOT FOUND", o.code, o.stdout, o.stderr)
	}
	sskvRun(t, cmd("del", "k")...).want(t, exitNotMet, "NOT FOUND\n", "")
	setOK(t, cmd("set", "k", "NOT FOUND")...) // a value that reads like it: on stdout, status 0
	sskvRun(t, cmd("get", "-raw", "k")...).want(t, exitOK, "NOT FOUND", "")
	sskvRun(t, cmd("del", "k")...)

	v := setOK(t, cmd("set", "k", "hello world")...)
	sskvRun(t, cmd("get", "k")...).want(t, exitOK, "hello world\n(version "+v+")\n", "")
	sskvRun(t, cmd("get", "-raw", "k")...).want(t, exitOK, "hello world", "")
	sskvRun(t, cmd("get", "k", "-raw")...).want(t, exitOK, "hello world", "")

	sskvRun(t, cmd("del", "k")...).want(t, exitOK, "DELETED "+v+"\n", "")
	sskvRun(t, cmd("del", "k")...).want(t, exitNotMet, "NOT FOUND\n", "")
	sskvRun(t, cmd("get", "k")...).want(t, exitNotMet, "", "NOT FOUND")

	// Values that are not printable, or would be ambiguous, are quoted.
	v = setOK(t, cmd("set", "bin", "a\x00\xff\n")...)
	sskvRun(t, cmd("get", "bin")...).want(t, exitOK, `"a\x00\xff\n"`+"\n(version "+v+")\n", "")
	sskvRun(t, cmd("get", "-raw", "bin")...).want(t, exitOK, "a\x00\xff\n", "")
	v = setOK(t, cmd("set", "empty", "")...)
	sskvRun(t, cmd("get", "empty")...).want(t, exitOK, `""`+"\n(version "+v+")\n", "")
	v = setOK(t, cmd("set", "--", "dash", "-5")...)
	sskvRun(t, cmd("get", "dash")...).want(t, exitOK, "-5\n(version "+v+")\n", "")
	v = setOK(t, cmd("set", "dash2", "--", "-x")...)
	sskvRun(t, cmd("get", "dash2")...).want(t, exitOK, "-x\n(version "+v+")\n", "")
}

func TestSetConditions(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	v1 := setOK(t, cmd("set", "k", "a", "-nx")...)
	notApplied := "NOT APPLIED (current version " + v1 + ")\n"
	sskvRun(t, cmd("set", "k", "b", "-nx")...).want(t, exitNotMet, notApplied, "")
	sskvRun(t, cmd("set", "-nx", "k", "b")...).want(t, exitNotMet, notApplied, "")
	sskvRun(t, cmd("set", "k", "b", "-nex")...).want(t, exitNotMet, notApplied, "")

	v2 := setOK(t, cmd("set", "k", "a", "-nex", "-px", "1m", "-persist")...) // renewal
	if v2 <= v1 {
		t.Fatalf("renewed version %s is not after %s", v2, v1)
	}
	v3 := setOK(t, cmd("set", "k", "a", "-px", "60000")...)
	sskvRun(t, cmd("get", "k")...).want(t, exitOK, "a\n(version "+v3+")\n", "")
}

func TestVDel(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	sskvRun(t, cmd("vdel", "lock", "me")...).want(t, exitNotMet, "NOT FOUND\n", "")
	v := setOK(t, cmd("set", "lock", "me")...)
	sskvRun(t, cmd("vdel", "lock", "you")...).want(t, exitNotMet, "VALUE DIFFERS (current version "+v+")\n", "")
	sskvRun(t, cmd("vdel", "lock", "me")...).want(t, exitOK, "DELETED "+v+"\n", "")
	sskvRun(t, cmd("get", "lock")...).want(t, exitNotMet, "", "NOT FOUND")
}

func TestFencing(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	// Take the lock; its version is the fencing token of the data.
	old := setOK(t, cmd("set", "lock", "worker-1", "-nx", "-px", "10s")...)
	setOK(t, cmd("set", "data", "v1", "-ft", old)...)

	// The lock changes hands; the new holder writes with its newer token.
	sskvRun(t, cmd("vdel", "lock", "worker-1")...).want(t, exitOK, "DELETED "+old+"\n", "")
	token := setOK(t, cmd("set", "lock", "worker-2", "-nx", "-px", "10s")...)
	v2 := setOK(t, cmd("set", "-ft", token, "data", "v2")...)

	// The old holder's token is refused, with the service's message.
	const refused = "\"data\": state store error: the request fencing token is a lower version than the fencing token protecting the resource\n"
	o := sskvRun(t, cmd("set", "data", "late", "-ft", old)...)
	o.want(t, exitError, "", refused)
	if o.stderr != "sskv: SET "+refused {
		t.Fatalf("stderr %q, want exactly %q", o.stderr, "sskv: SET "+refused)
	}
	sskvRun(t, cmd("del", "data", "-ft", old)...).want(t, exitError, "", "sskv: DEL "+refused)
	sskvRun(t, cmd("vdel", "data", "v2", "-ft", old)...).want(t, exitError, "", "sskv: VDEL "+refused)
	sskvRun(t, cmd("get", "data")...).want(t, exitOK, "v2\n(version "+v2+")\n", "")
}

func TestFencingRefusedKeepsValue(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	old := setOK(t, append(a, "set", "lock", "x")...)
	newer := setOK(t, append(a, "set", "lock", "y")...)
	v := setOK(t, append(a, "set", "data", "v2", "-ft", newer)...)
	sskvRun(t, append(a, "set", "data", "late", "-ft", old)...).want(t, exitError, "", "fencing token is a lower version")
	sskvRun(t, append(a, "get", "data")...).want(t, exitOK, "v2\n(version "+v+")\n", "")
	sskvRun(t, append(a, "del", "data", "-ft", newer)...).want(t, exitOK, "DELETED "+v+"\n", "")
}

func TestValueFromFile(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	path := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(path, []byte("from\nfile"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := setOK(t, cmd("set", "k", "-file", path)...)
	sskvRun(t, cmd("get", "-raw", "k")...).want(t, exitOK, "from\nfile", "")
	sskvRun(t, cmd("vdel", "k", "from", "-file", path)...).want(t, exitUsage, "", "VALUE and -file are both given")
	sskvRun(t, cmd("vdel", "-file", path, "k")...).want(t, exitOK, "DELETED "+v+"\n", "")

	o := sskvIn(t, strings.NewReader("from\x00stdin"), cmd("set", "k", "-file", "-")...)
	if o.code != exitOK || !okLine.MatchString(o.stdout) {
		t.Fatalf("set from stdin: %+v", o)
	}
	sskvRun(t, cmd("get", "-raw", "k")...).want(t, exitOK, "from\x00stdin", "")

	sskvRun(t, cmd("set", "k", "-file", filepath.Join(t.TempDir(), "missing"))...).want(t, exitError, "", "sskv: open ")
}

func TestBadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "sskv: no command (one of get, set"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"-nosuchflag", "get", "k"}, "flag provided but not defined: -nosuchflag"},
		{[]string{"get"}, "sskv: get: missing arguments"},
		{[]string{"get", "a", "b"}, `sskv: get: too many arguments ["b"]`},
		{[]string{"get", "-nx", "k"}, "flag provided but not defined: -nx"},
		{[]string{"get", "k", "-addr", "h:1"}, "(-addr is a connection flag: give it before the command)"},
		{[]string{"set", "k"}, "sskv: set: missing arguments"},
		{[]string{"set", "k", "v", "-nx", "-nex"}, "-nx and -nex exclude each other"},
		{[]string{"set", "k", "v", "-px", "0"}, "must be at least 1ms"},
		{[]string{"set", "k", "v", "-px", "soon"}, `invalid value "soon" for flag -px`},
		// Whole milliseconds beyond time.Duration used to wrap around into
		// another expiry (1 s, or 123 years) instead of being refused.
		{[]string{"set", "k", "v", "-px", "18446744074710"}, "18446744074710 ms is out of range (at most 9223372036854 ms"},
		{[]string{"set", "k", "v", "-px", "999999999999999"}, "999999999999999 ms is out of range"},
		{[]string{"set", "k", "v", "-px", "99999999999999999999"}, "99999999999999999999 ms is out of range"},
		{[]string{"set", "k", "v", "-px", "3000000h"}, `invalid duration "3000000h"`},
		{[]string{"-addr", "nocolon", "get", "k"}, `-addr "nocolon": want host:port`},
		{[]string{"-addr", "h:http", "get", "k"}, `-addr "h:http": the port must be a number`},
		{[]string{"-addr", "h:0", "get", "k"}, `-addr "h:0": the port must be a number`},
		{[]string{"set", "k", "v", "-ft", "bogus"}, `invalid value "bogus" for flag -ft`},
		{[]string{"del"}, "sskv: del: missing arguments"},
		{[]string{"vdel", "k"}, "sskv: vdel: missing arguments"},
		{[]string{"watch"}, "sskv: watch: missing arguments"},
		{[]string{"help", "frob"}, "sskv: help frob: unknown command"},
		{[]string{"-timeout", "0", "get", "k"}, "-timeout must be positive"},
		{[]string{"-cert", "c.pem", "get", "k"}, "-cert and -key go together"},
		{[]string{"-tls=false", "-ca", "ca.pem", "get", "k"}, "need TLS, but -tls=false"},
		{[]string{"-sat-file", "t", "-password-file", "p", "get", "k"}, "-sat-file and -password-file exclude each other"},
	} {
		o := sskvRun(t, tc.args...)
		if o.code != exitUsage || o.stdout != "" || !strings.Contains(o.stderr, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, o.code, o.stdout, o.stderr, tc.want)
		}
		// The error first, then where to read the usage: not the whole
		// help, which scrolled the error away.
		lines := strings.Split(strings.TrimSuffix(o.stderr, "\n"), "\n")
		if !strings.HasPrefix(o.stderr, "sskv: ") || len(lines) > 2 && !strings.HasPrefix(lines[1], "(-") || len(lines) > 3 || !usagePointer.MatchString(lines[len(lines)-1]) {
			t.Errorf("%q: stderr %q; want the error, then \"Run 'sskv help CMD' for usage.\"", tc.args, o.stderr)
		}
	}
	// The pointer names the command whose usage was wrong.
	sskvRun(t, "get").want(t, exitUsage, "", "sskv: get: missing arguments (want [-raw] KEY)\nRun 'sskv help get' for usage.\n")
	sskvRun(t, "frob").want(t, exitUsage, "", "(one of get, set, del, vdel, watch, lock, elect, help, version)\nRun 'sskv -h' for usage.\n")
}

var usagePointer = regexp.MustCompile(`^Run 'sskv (-h|help [a-z]+)' for usage\.$`)

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"Commands:", "Connection flags:", "-insecure-skip-verify", "Examples:", "Exit status"}},
		{[]string{"help"}, []string{"Commands:", "Connection flags:"}},
		{[]string{"help", "set"}, []string{"sskv [connection flags] set KEY VALUE", "-nx", "-px DURATION", "NOT APPLIED"}},
		{[]string{"help", "get"}, []string{"prints nothing on stdout and\nNOT FOUND on stderr", "status 3"}},
		{[]string{"-h"}, []string{"get prints the value alone, so a missing key prints\nNOT FOUND on stderr"}},
		{[]string{"set", "-h"}, []string{"-nex", "-file"}},
		{[]string{"watch", "-help"}, []string{"(resync)"}},
	} {
		o := sskvRun(t, tc.args...)
		if o.code != exitOK || o.stderr != "" {
			t.Errorf("%q: exit %d, stderr %q; want exit 0 and help on stdout", tc.args, o.code, o.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(o.stdout, w) {
				t.Errorf("%q: help does not mention %q:\n%s", tc.args, w, o.stdout)
			}
		}
	}
}

func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// A connection that cannot be made fails at once with its cause, not after
// -timeout with "context deadline exceeded".
func TestDialError(t *testing.T) {
	addr := closedAddr(t)
	start := time.Now()
	o := sskvRun(t, "-addr", addr, "get", "k")
	o.want(t, exitError, "", "sskv: dial "+addr+": ")
	if !strings.Contains(o.stderr, "connection refused") || strings.Contains(o.stderr, "sskv: sskv:") {
		t.Errorf("stderr %q; want the cause, said once", o.stderr)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a refused connection took %v to report (the -timeout is 10s)", d)
	}
	// Not MQTT: an HTTP-like server that answers with text.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			_ = c.Close()
		}
	}()
	o = sskvRun(t, "-addr", ln.Addr().String(), "get", "k")
	o.want(t, exitError, "", "sskv: dial "+ln.Addr().String()+": ")
	if !strings.Contains(o.stderr, "MQTT") {
		t.Errorf("stderr %q; want it to say the server is not an MQTT broker", o.stderr)
	}
}

// -addr :PORT is this machine, as -listen :PORT of the store is.
func TestAddrWithoutHost(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	_, port, _ := net.SplitHostPort(srv.Addr())
	setOK(t, "-addr", ":"+port, "set", "k", "v")
}

func TestServiceError(t *testing.T) {
	srv := startStore(t, localstore.Config{KeyPrefixes: map[string][]string{"": {"app/"}}})
	setOK(t, "-addr", srv.Addr(), "set", "app/k", "v")
	sskvRun(t, "-addr", srv.Addr(), "get", "other/k").want(t, exitError, "", "sskv: GET \"other/k\": state store error: not authorized\n")
	o := sskvRun(t, "-addr", srv.Addr(), "watch", "other/k")
	o.want(t, exitError, "", "")
	// Each part once: the issue saw 'sskv: "": sskv: watch: sskv: state store error: ...'.
	if want := "sskv: watch \"other/k\": state store error: not authorized\n"; o.stderr != want {
		t.Fatalf("stderr %q; want %q", o.stderr, want)
	}
}

func TestAuthAndEnv(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"alice": "secret"}})
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sskvRun(t, "-addr", srv.Addr(), "-timeout", "300ms", "get", "k").want(t, exitError, "", "sskv: dial ")
	v := setOK(t, "-addr", srv.Addr(), "-user", "alice", "-password-file", pw, "set", "k", "v")
	sskvRun(t, "-addr", srv.Addr(), "-user", "alice", "-password-file", pw+".missing", "get", "k").
		want(t, exitError, "", "sskv: -password-file: open ")

	host, port, _ := net.SplitHostPort(srv.Addr())
	t.Setenv(sskv.EnvBrokerHostname, host)
	t.Setenv(sskv.EnvBrokerPort, port)
	t.Setenv(sskv.EnvUseTLS, "false")
	t.Setenv(sskv.EnvClientID, "sskv-env-test")
	t.Setenv(sskv.EnvUsername, "alice")
	t.Setenv(sskv.EnvPasswordFile, pw)
	want := "v\n(version " + v + ")\n"
	sskvRun(t, "-env", "get", "k").want(t, exitOK, want, "")
	sskvRun(t, "-env", "-client-id", "other", "get", "k").want(t, exitOK, want, "")

	// Explicit flags override the environment.
	t.Setenv(sskv.EnvBrokerPort, strings.Split(closedAddr(t), ":")[1])
	sskvRun(t, "-env", "-timeout", "300ms", "get", "k").want(t, exitError, "", "sskv: dial ")
	sskvRun(t, "-env", "-addr", srv.Addr(), "get", "k").want(t, exitOK, want, "")

	// Without -env the environment is not used.
	sskvRun(t, "-addr", srv.Addr(), "-timeout", "300ms", "get", "k").want(t, exitError, "", "sskv: dial ")

	t.Setenv(sskv.EnvUseTLS, "maybe")
	sskvRun(t, "-env", "get", "k").want(t, exitError, "", "sskv: invalid config: AIO_MQTT_USE_TLS=\"maybe\": not a boolean\n")
}

// writeCert writes a self-signed certificate for 127.0.0.1 to dir/ca.pem
// and returns its path and the certificate for a server.
func writeCert(t *testing.T, dir string) (string, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sskv test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestTLS(t *testing.T) {
	ca, cert := writeCert(t, t.TempDir())
	srv := startStore(t, localstore.Config{Addr: "-", TLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	v := setOK(t, "-addr", srv.TLSAddr(), "-ca", ca, "set", "k", "v")
	sskvRun(t, "-addr", srv.TLSAddr(), "-tls", "-ca", ca, "get", "k").want(t, exitOK, "v\n(version "+v+")\n", "")
	sskvRun(t, "-addr", srv.TLSAddr(), "-insecure-skip-verify", "get", "k").
		want(t, exitOK, "v\n(version "+v+")\n", "warning: -insecure-skip-verify")
	// The refused certificate ends the dial at once; the timeout only has to
	// outlast a TLS handshake on a loaded machine.
	sskvRun(t, "-addr", srv.TLSAddr(), "-tls", "-timeout", "5s", "get", "k").
		want(t, exitError, "", "certificate signed by unknown authority")

	t.Setenv(sskv.EnvBrokerHostname, "127.0.0.1")
	t.Setenv(sskv.EnvBrokerPort, strings.Split(srv.TLSAddr(), ":")[1])
	t.Setenv(sskv.EnvTLSCAFile, ca)
	sskvRun(t, "-env", "get", "k").want(t, exitOK, "v\n(version "+v+")\n", "")
}

// syncBuffer collects a program's output; tests wait for the lines they
// expect.
type syncBuffer = storetest.Output

var newSyncBuffer = storetest.NewOutput

const timePattern = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(?:Z|[+-]\d\d:\d\d)`

func TestWatch(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	stdout, stderr := newSyncBuffer(), newSyncBuffer()
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"-addr", srv.Addr(), "watch", "k1", "k 2"}, nil, stdout, stderr) }()
	t.Cleanup(func() { cancel(); <-done })

	stderr.WaitFor(t, regexp.MustCompile(`(?m)^watching k1 "k 2" \(Ctrl-C to stop\)\n`))

	v1 := setOK(t, "-addr", srv.Addr(), "set", "k1", "hello")
	v2 := setOK(t, "-addr", srv.Addr(), "set", "k 2", "a b", "-px", "100ms")
	v3 := setOK(t, "-addr", srv.Addr(), "set", "k1", "\x01")
	sskvRun(t, "-addr", srv.Addr(), "del", "k1").want(t, exitOK, "DELETED "+v3+"\n", "")

	q := regexp.QuoteMeta
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` k1 SET hello `+q(v1)+`\n`))
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` "k 2" SET "a b" `+q(v2)+`\n`))
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` k1 SET "\\x01" `+q(v3)+`\n`))
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` k1 DELETE - \d{15}:\d{5}:statestore\n`))
	// The expiry of "k 2" (-px 100ms) is a DELETE too.
	stdout.WaitFor(t, regexp.MustCompile(`(?m)^`+timePattern+` "k 2" DELETE - \d{15}:\d{5}:statestore\n`))

	cancel()
	select {
	case code := <-done:
		done <- code // for the cleanup
		if code != exitOK {
			t.Fatalf("watch exited with %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after its context was cancelled")
	}
	if n := strings.Count(stdout.String(), "\n"); n != 5 {
		t.Errorf("got %d lines, want 5:\n%s", n, stdout.String())
	}
	if got := stderr.String(); got != "watching k1 \"k 2\" (Ctrl-C to stop)\n" {
		t.Errorf("stderr %q", got)
	}
}

// Interrupted before it is connected, a command reports it.
func TestCancelledBeforeDial(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-addr", srv.Addr(), "watch", "k"}, nil, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), "context canceled") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

func TestShowValue(t *testing.T) {
	for _, tc := range []struct {
		in           string
		plain, field string
	}{
		{"hello", "hello", "hello"},
		{"a b", "a b", `"a b"`},
		{"", `""`, `""`},
		{`"quoted"`, `"\"quoted\""`, `"\"quoted\""`},
		{"tab\there", `"tab\there"`, `"tab\there"`},
		{"line\n", `"line\n"`, `"line\n"`},
		{"\xff", `"\xff"`, `"\xff"`},
		{"grüße", "grüße", "grüße"},
		{"\u00a0", `"\u00a0"`, `"\u00a0"`},
	} {
		if got := showValue([]byte(tc.in), false); got != tc.plain {
			t.Errorf("showValue(%q, false) = %s, want %s", tc.in, got, tc.plain)
		}
		if got := showValue([]byte(tc.in), true); got != tc.field {
			t.Errorf("showValue(%q, true) = %s, want %s", tc.in, got, tc.field)
		}
	}
}

func TestEventLine(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	v := hlc.Timestamp{Wall: 1735787045006, Counter: 2, Node: "statestore"}
	for _, tc := range []struct {
		ev   sskv.Event
		want string
	}{
		{sskv.Event{Key: "k", Op: sskv.OpSet, Value: []byte("v"), Version: v},
			"2025-01-02T03:04:05.006Z k SET v 001735787045006:00002:statestore\n"},
		{sskv.Event{Key: "k", Op: sskv.OpDelete, Version: v, Resync: true},
			"2025-01-02T03:04:05.006Z k DELETE - 001735787045006:00002:statestore (resync)\n"},
		{sskv.Event{Key: "k", Op: sskv.OpDelete, Resync: true},
			"2025-01-02T03:04:05.006Z k DELETE - - (resync)\n"},
		{sskv.Event{Key: "k", Op: sskv.OpSet, Value: []byte{}, Version: v},
			`2025-01-02T03:04:05.006Z k SET "" 001735787045006:00002:statestore` + "\n"},
	} {
		if got := eventLine(at, tc.ev); got != tc.want {
			t.Errorf("eventLine(%+v) = %q, want %q", tc.ev, got, tc.want)
		}
	}
}

func TestParsePX(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"1ms", time.Millisecond},
		{"1", time.Millisecond},
		{"10s", 10 * time.Second},
		{"60000", time.Minute},
		{"9223372036854", maxPX}, // the longest expiry there is: about 292 years
		{"2562047h47m16.854s", maxPX},
	} {
		if got, err := parsePX(tc.in); err != nil || got != tc.want {
			t.Errorf("parsePX(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"0", "999us", "-5", "9223372036855", "1e3"} {
		if got, err := parsePX(in); err == nil {
			t.Errorf("parsePX(%q) = %v; want an error", in, got)
		}
	}
}
