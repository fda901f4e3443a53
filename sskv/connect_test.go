package sskv_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

func TestTLS(t *testing.T) {
	cert, pool, _ := selfSigned(t)
	srv := startStore(t, localstore.Config{Addr: "-", TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	c, err := tryDial(t, srv, func(cfg *sskv.Config) {
		cfg.Addr = srv.TLSAddr()
		cfg.TLS = &tls.Config{RootCAs: pool}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if g, err := c.Get(ctx, "k"); err != nil || string(g.Value) != "v" {
		t.Fatalf("Get over TLS: %+v, %v", g, err)
	}

	// An untrusted server certificate never connects: Dial says so at once
	// instead of retrying until its context ends.
	_, err = sskv.Dial(testCtx(t), sskv.Config{Addr: srv.TLSAddr(), TLS: &tls.Config{}, ReconnectMin: 10 * time.Millisecond})
	var unknownCA x509.UnknownAuthorityError
	if !errors.As(err, &unknownCA) {
		t.Fatalf("Dial with an unknown CA: %v", err)
	}
}

func TestUsernamePassword(t *testing.T) {
	srv := startStore(t, localstore.Config{Users: map[string]string{"app": "s3cret"}})
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.Password = "app", []byte("s3cret") })
	if _, err := c.Set(testCtx(t), "k", nil, sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	writeFile(t, pw, "s3cret")
	c2 := dial(t, srv, func(cfg *sskv.Config) { cfg.Username, cfg.PasswordFile = "app", pw })
	if _, err := c2.Get(testCtx(t), "k"); err != nil {
		t.Fatal(err)
	}

	// Wrong credentials, or a password file that cannot be read: Dial fails
	// at once with the reason.
	_, err := sskv.Dial(testCtx(t), sskv.Config{Addr: srv.Addr(), Username: "app", Password: []byte("wrong"), ReconnectMin: 10 * time.Millisecond})
	var ce *sskv.ConnectError
	if !errors.As(err, &ce) || ce.ReasonCode != 0x86 || !strings.Contains(err.Error(), "bad user name or password") {
		t.Fatalf("Dial with a wrong password: %v", err)
	}
	_, err = sskv.Dial(testCtx(t), sskv.Config{Addr: srv.Addr(), Username: "app", PasswordFile: pw + ".missing", ReconnectMin: 10 * time.Millisecond})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Dial with a missing password file: %v", err)
	}
}

// TestSATReread: the service account token file is read on every connection,
// so a rotated token (here: another identity) is used after a reconnect.
func TestSATReread(t *testing.T) {
	srv := startStore(t, localstore.Config{
		SATTokens:   map[string]string{"token-a": "pod-a", "token-b": "pod-b"},
		KeyPrefixes: map[string][]string{"pod-a": {"a/"}, "pod-b": {"b/"}},
	})
	sat := filepath.Join(t.TempDir(), "token")
	writeFile(t, sat, "token-a")
	c := dial(t, srv, func(cfg *sskv.Config) { cfg.SATFile = sat })
	ctx := testCtx(t)
	if _, err := c.Set(ctx, "a/k", nil, sskv.SetOptions{}); err != nil {
		t.Fatalf("as pod-a: %v", err)
	}
	if _, err := c.Set(ctx, "b/k", nil, sskv.SetOptions{}); !errors.Is(err, sskv.ErrNotAuthorized) {
		t.Fatalf("pod-a writing b/: %v", err)
	}

	writeFile(t, sat, "token-b")
	if err := srv.Kick(c.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Set(ctx, "b/k", nil, sskv.SetOptions{}); err != nil {
		t.Fatalf("as pod-b after reconnect: %v", err)
	}
	if _, err := c.Set(ctx, "a/k", nil, sskv.SetOptions{}); !errors.Is(err, sskv.ErrNotAuthorized) {
		t.Fatalf("pod-b writing a/: %v", err)
	}

	writeFile(t, sat, "token-unknown")
	var ce *sskv.ConnectError
	if _, err := sskv.Dial(testCtx(t), sskv.Config{Addr: srv.Addr(), SATFile: sat, ReconnectMin: 10 * time.Millisecond}); !errors.As(err, &ce) {
		t.Fatalf("Dial with an unknown token: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]sskv.Config{
		"no addr":            {},
		"no port":            {Addr: "localhost"},
		"bad port":           {Addr: "localhost:99999"},
		"wildcard client id": {Addr: "h:1", ClientID: "a+b"},
		"colon client id":    {Addr: "h:1", ClientID: "a:b"},
		"negative expiry":    {Addr: "h:1", SessionExpiry: -time.Second},
		"sub-second expiry":  {Addr: "h:1", SessionExpiry: time.Millisecond},
		"password twice":     {Addr: "h:1", Password: []byte("x"), PasswordFile: "/f"},
		"sat and password":   {Addr: "h:1", SATFile: "/t", Password: []byte("x")},
		"negative timeout":   {Addr: "h:1", RequestTimeout: -1},
		"huge keepalive":     {Addr: "h:1", KeepAlive: 100000 * time.Second},
		"backoff reversed":   {Addr: "h:1", ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
		"negative buffer":    {Addr: "h:1", WatchBuffer: -1},
	} {
		if _, err := sskv.Dial(context.Background(), cfg); !errors.Is(err, sskv.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

func TestDialUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = sskv.Dial(ctx, sskv.Config{Addr: addr, ReconnectMin: 10 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
}

func TestConfigFromEnv(t *testing.T) {
	dir := t.TempDir()
	cert, _, der := selfSigned(t)
	ca := filepath.Join(dir, "ca.pem")
	writeFile(t, ca, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyDER, err := x509MarshalKey(cert)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key.pem")
	writeFile(t, key, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))

	t.Setenv("AIO_BROKER_HOSTNAME", "aio-broker")
	t.Setenv("AIO_BROKER_TCP_PORT", "18883")
	t.Setenv("AIO_MQTT_USE_TLS", "true")
	t.Setenv("AIO_MQTT_CLIENT_ID", "my-app")
	t.Setenv("AIO_MQTT_CLEAN_START", "true")
	t.Setenv("AIO_MQTT_KEEP_ALIVE", "30")
	t.Setenv("AIO_MQTT_SESSION_EXPIRY", "600")
	t.Setenv("AIO_SAT_FILE", "/var/run/secrets/tokens/broker-sat")
	t.Setenv("AIO_TLS_CA_FILE", ca)
	t.Setenv("AIO_TLS_CERT_FILE", ca)
	t.Setenv("AIO_TLS_KEY_FILE", key)
	cfg, err := sskv.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "aio-broker:18883" || cfg.ClientID != "my-app" || !cfg.CleanStart ||
		cfg.KeepAlive != 30*time.Second || cfg.SessionExpiry != 10*time.Minute ||
		cfg.SATFile != "/var/run/secrets/tokens/broker-sat" || cfg.TLS == nil || cfg.TLS.RootCAs == nil ||
		len(cfg.TLS.Certificates) != 1 {
		t.Fatalf("config %+v", cfg)
	}

	// DialEnv against a local store.
	srv := startStore(t, localstore.Config{})
	host, port, _ := net.SplitHostPort(srv.Addr())
	t.Setenv("AIO_BROKER_HOSTNAME", host)
	t.Setenv("AIO_BROKER_TCP_PORT", port)
	t.Setenv("AIO_MQTT_USE_TLS", "false")
	t.Setenv("AIO_MQTT_CLIENT_ID", testID(t))
	t.Setenv("AIO_SAT_FILE", "")
	t.Setenv("AIO_TLS_CA_FILE", "")
	t.Setenv("AIO_TLS_CERT_FILE", "")
	t.Setenv("AIO_TLS_KEY_FILE", "")
	c, err := sskv.DialEnv(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Set(testCtx(t), "k", nil, sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestConfigFromEnvErrors(t *testing.T) {
	base := map[string]string{"AIO_BROKER_HOSTNAME": "h", "AIO_MQTT_USE_TLS": "false"}
	for _, tc := range []struct{ name, value string }{
		{"AIO_BROKER_HOSTNAME", ""},
		{"AIO_BROKER_TCP_PORT", "http"},
		{"AIO_BROKER_TCP_PORT", "70000"},
		{"AIO_MQTT_USE_TLS", "maybe"},
		{"AIO_MQTT_CLIENT_ID", "a:b"},
		{"AIO_MQTT_CLEAN_START", "yes please"},
		{"AIO_MQTT_KEEP_ALIVE", "-1"},
		{"AIO_MQTT_KEEP_ALIVE", "70000"},
		{"AIO_MQTT_SESSION_EXPIRY", "0"},
		{"AIO_MQTT_SESSION_EXPIRY", "1.5"},
		{"AIO_TLS_CA_FILE", "/x.pem"}, // TLS files without TLS
	} {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		env[tc.name] = tc.value
		_, err := sskv.ConfigFromLookupForTest(env)
		if !errors.Is(err, sskv.ErrConfig) || !strings.Contains(err.Error(), tc.name) && tc.name != "AIO_TLS_CA_FILE" {
			t.Errorf("%s=%q: %v", tc.name, tc.value, err)
		}
	}
	for name, env := range map[string]map[string]string{
		"missing CA file":  {"AIO_BROKER_HOSTNAME": "h", "AIO_TLS_CA_FILE": "/does/not/exist"},
		"cert without key": {"AIO_BROKER_HOSTNAME": "h", "AIO_TLS_CERT_FILE": "/c"},
		"sat and password": {"AIO_BROKER_HOSTNAME": "h", "AIO_SAT_FILE": "/t", "AIO_MQTT_PASSWORD_FILE": "/p"},
	} {
		if _, err := sskv.ConfigFromLookupForTest(env); !errors.Is(err, sskv.ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	cfg, err := sskv.ConfigFromLookupForTest(map[string]string{"AIO_BROKER_HOSTNAME": "h"})
	if err != nil || cfg.Addr != "h:18883" || cfg.TLS == nil {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
}

func TestReconnectBackoff(t *testing.T) {
	minD, maxD := 100*time.Millisecond, 2*time.Second
	b := sskv.ReconnectBackoffForTest(minD, maxD)
	if d := b(0); d != 0 {
		t.Fatalf("first connection delayed %v", d)
	}
	for cycle := 0; cycle < 3; cycle++ {
		first := b(0)
		if first < minD || first > 2*minD {
			t.Fatalf("first reconnect delay %v", first)
		}
		for n := 1; n < 20; n++ {
			if d := b(n); d < minD || d > maxD*3/2 {
				t.Fatalf("attempt %d: delay %v", n, d)
			}
		}
	}
}

// TestNewFromConnection: a client on an application's own connection, with
// the application routing its events; it survives a reconnect, and a lost
// session fails requests in flight with ErrConnectionLost.
func TestNewFromConnection(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	id := testID(t)
	var client *sskv.Client
	ready := make(chan struct{})
	u := &url.URL{Scheme: "mqtt", Host: srv.Addr()}
	cm, err := autopaho.NewConnection(context.Background(), autopaho.ClientConfig{
		ServerUrls:            []*url.URL{u},
		KeepAlive:             30,
		SessionExpiryInterval: 60,
		ReconnectBackoff:      autopaho.NewConstantBackoff(10 * time.Millisecond),
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			select {
			case <-ready:
				client.ConnectionUp(ca)
			default:
			}
		},
		OnConnectionDown: func() bool {
			select {
			case <-ready:
				client.ConnectionDown()
			default:
			}
			return true
		},
		ClientConfig: paho.ClientConfig{
			ClientID: id,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				select {
				case <-ready:
					return client.HandlePublish(pr)
				default:
					return false, nil
				}
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cm.Disconnect(context.Background()) }()
	client, err = sskv.NewFromConnection(testCtx(t), cm, id, sskv.Config{})
	if err != nil {
		t.Fatal(err)
	}
	close(ready)
	defer client.Close()
	ctx := testCtx(t)
	other := dial(t, srv)

	w, err := client.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantInitial(t, w, sskv.OpDelete, "")
	if err := srv.Kick(id); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Set(ctx, "x", []byte("1"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch to be registered again", func() bool { return srv.Watching(id, "k") })
	if _, err := other.Set(ctx, "k", []byte("v"), sskv.SetOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		if ev := nextEvent(t, w); string(ev.Value) == "v" {
			break
		}
	}

	w.Stop()

	// A reconnect without the session: the request in flight has an
	// unknown outcome.
	f := startFake(t, srv)
	f.attach(client)
	done := make(chan error, 1)
	go func() { _, err := client.Get(testCtx(t), "k"); done <- err }()
	f.next()
	client.ConnectionDown()
	client.ConnectionUp(&paho.Connack{SessionPresent: false})
	if err := <-done; !errors.Is(err, sskv.ErrConnectionLost) {
		t.Fatalf("err %v, want ErrConnectionLost", err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	// The application's connection is still up.
	if err := cm.AwaitConnection(ctx); err != nil {
		t.Fatal(err)
	}
}
