package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// The standalone store's limits default to an embedded store's (the zero
// localstore.Config, whose MaxPacketSize Start fills in with
// DefaultMaxPacketSize), so that a test behaves alike on both.
func TestDefaultsMatchEmbedded(t *testing.T) {
	fs := flag.NewFlagSet("statestore", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := runArgs(fs, []string{"-version"}); err != nil { // defines the flags, starts nothing
		t.Fatal(err)
	}
	var zero localstore.Config
	for name, want := range map[string]int{
		"max-keys":        zero.MaxKeys,
		"max-key-size":    zero.MaxKeySize,
		"max-value-size":  zero.MaxValueSize,
		"max-packet-size": localstore.DefaultMaxPacketSize,
	} {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("no -%s flag", name)
			continue
		}
		if f.DefValue != strconv.Itoa(want) {
			t.Errorf("-%s defaults to %s; an embedded store's default is %d", name, f.DefValue, want)
		}
	}
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// configErr runs configure with args and returns its error.
func configErr(args ...string) error {
	fs := flag.NewFlagSet("statestore", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	_, _, err := configure(fs, args)
	return err
}

// startErr runs configure with args and, if it succeeds, starts the store
// (on a free loopback port) and stops it at once: it returns the first
// error.
func startErr(args ...string) error {
	fs := flag.NewFlagSet("statestore", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg, _, err := configure(fs, args)
	if err != nil {
		return err
	}
	if cfg.Addr != "-" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.TLS != nil {
		cfg.TLSAddr = "127.0.0.1:0"
	}
	srv, err := localstore.Start(*cfg)
	if err != nil {
		return err
	}
	return srv.Close()
}

// TestRefusesAnonymousNetwork: off loopback, a listener that anyone may use
// is refused unless -allow-anonymous-network says so; on loopback, or with
// authentication, it is not.
func TestRefusesAnonymousNetwork(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t, dir)
	users := writeFile(t, dir, "users", "alice:pw\n")
	tlsArgs := []string{"-tls-cert", pki.serverCert, "-tls-key", pki.serverKey}
	for _, args := range [][]string{
		{"-listen", "0.0.0.0:0"},
		{"-listen", ":0"},
		{"-listen", "[::]:0"},
		{"-listen", "192.0.2.1:1883"},
		{"-listen", "store.example:1883"},
		append([]string{"-listen", "-", "-tls-listen", "0.0.0.0:0"}, tlsArgs...),
		// The TLS listener verifies certificates; the plain one does not.
		append([]string{"-listen", "0.0.0.0:0", "-client-ca", pki.caCert}, tlsArgs...),
	} {
		err := configErr(args...)
		if err == nil || !strings.Contains(err.Error(), "without authentication") || !strings.Contains(err.Error(), "-allow-anonymous-network") {
			t.Errorf("%q: error %v; want a refusal that says what to do", args, err)
		}
	}
	for _, args := range [][]string{
		{},
		{"-listen", "127.0.0.1:0"},
		{"-listen", "localhost:0"},
		{"-listen", "[::1]:0"},
		{"-listen", "0.0.0.0:0", "-allow-anonymous-network"},
		{"-listen", "0.0.0.0:0", "-users", users},
		append([]string{"-listen", "-", "-tls-listen", "0.0.0.0:0", "-client-ca", pki.caCert}, tlsArgs...),
	} {
		if err := configErr(args...); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

// TestBadFiles: a bad credentials or prefixes file, or flags that do not go
// together, are refused with an error that says where and why.
func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	pki := newPKI(t, dir)
	users := writeFile(t, dir, "users", "# team\nalice:pw\n\nbob:pw2\n")
	tlsArgs := []string{"-tls-cert", pki.serverCert, "-tls-key", pki.serverKey}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-users", writeFile(t, dir, "u1", "alice:pw\n\nbob\n")}, "u1:3: want name:password"},
		{[]string{"-users", writeFile(t, dir, "u2", "alice:pw\n:pw\n")}, "u2:2: want name:password"},
		{[]string{"-users", writeFile(t, dir, "u3", "alice:\n")}, "u3:1: want name:password"},
		{[]string{"-users", writeFile(t, dir, "u4", "alice:pw\n# x\nalice:other\n")}, `u4:3: user "alice" is already on line 1`},
		{[]string{"-users", writeFile(t, dir, "u5", "# nobody\n")}, "u5: no name:password line"},
		{[]string{"-users", filepath.Join(dir, "missing")}, "missing: no such file"},
		{[]string{"-sat-tokens", writeFile(t, dir, "s1", "alice:tok\nbob:tok\n")}, `s1:2: this token is already given to "alice"`},
		{[]string{"-sat-tokens", writeFile(t, dir, "s2", "alice tok\n")}, "s2:1: want user:token"},
		{[]string{"-users", users, "-key-prefixes", writeFile(t, dir, "p1", "alice=a/\nbob b/\n")}, "p1:2: want user=prefix"},
		{[]string{"-users", users, "-key-prefix", "alice"}, "want user=prefix"},
		{[]string{"-users", users, "-key-prefix", "alice=a/", "-key-prefix", "carol=c/"}, `users ["carol"], whom neither -users nor -sat-tokens names`},
		{[]string{"-key-prefix", "alice=a/"}, "no client can be verified"}, // no authentication at all (localstore.Start says)
		{[]string{"-client-ca", pki.caCert}, "-client-ca needs the TLS listener"},
		{append([]string{"-client-ca", users}, tlsArgs...), "users: no PEM certificate"},
		{[]string{"-listen", "-"}, "no listener"},
		{[]string{"-max-watches-per-client", "-1"}, "must be 0 (no limit) or more"},
	} {
		err := startErr(c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v; want one containing %q", c.args, err, c.want)
		}
	}
}

// TestDefaultLimits: the limits an embedded store does not set are set by
// default; those on keys per user only when clients authenticate, unless
// given explicitly.
func TestDefaultLimits(t *testing.T) {
	users := writeFile(t, t.TempDir(), "users", "alice:pw\n")
	for _, c := range []struct {
		args               []string
		keys               int
		bytes              int64
		watches, subs, ret int
	}{
		{nil, 0, 0, defaultMaxWatchesPerClient, defaultMaxSubscriptionsPerClient, defaultMaxRetainedPerUser},
		{[]string{"-max-keys-per-user", "7"}, 7, 0, defaultMaxWatchesPerClient, defaultMaxSubscriptionsPerClient, defaultMaxRetainedPerUser},
		{[]string{"-users", users}, defaultMaxKeysPerUser, defaultMaxBytesPerUser, defaultMaxWatchesPerClient, defaultMaxSubscriptionsPerClient, defaultMaxRetainedPerUser},
		{[]string{"-users", users, "-max-keys-per-user", "0", "-max-watches-per-client", "0", "-max-subscriptions-per-client", "5", "-max-retained-per-user", "0"}, 0, defaultMaxBytesPerUser, 0, 5, 0},
	} {
		fs := flag.NewFlagSet("statestore", flag.ContinueOnError)
		cfg, _, err := configure(fs, c.args)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if cfg.MaxKeysPerUser != c.keys || cfg.MaxBytesPerUser != c.bytes || cfg.MaxWatchesPerClient != c.watches ||
			cfg.MaxSubscriptionsPerClient != c.subs || cfg.MaxRetainedPerUser != c.ret ||
			c.ret != 0 && cfg.MaxRetainedBytesPerUser != defaultMaxRetainedBytesPerUser {
			t.Errorf("%q: limits %+v", c.args, cfg)
		}
	}
}
