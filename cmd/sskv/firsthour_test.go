package main

import (
	"strings"
	"testing"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// Bad durations are refused before connecting, with a message that names
// the flag, the value and what a valid one looks like.
func TestDurationErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lock", "-ttl", "abc", "x", "--", "true"}, `invalid value "abc" for flag -ttl: not a duration: write a number and a unit, such as 10s`},
		{[]string{"lock", "-ttl", "10", "x", "--", "true"}, `invalid value "10" for flag -ttl: missing unit: write 10s or 10ms`},
		{[]string{"lock", "-ttl", "3ms", "x", "--", "true"}, "-ttl 3ms: must be at least 100ms"},
		{[]string{"lock", "-ttl", "0s", "x", "--", "true"}, "-ttl 0s: must be a positive whole number of milliseconds"},
		{[]string{"lock", "-ttl", "-5s", "x", "--", "true"}, "-ttl -5s: must be a positive whole number of milliseconds"},
		{[]string{"lock", "-ttl", "1500us", "x", "--", "true"}, "-ttl 1.5ms: must be a positive whole number of milliseconds"},
		{[]string{"elect", "-ttl", "3ms", "svc", "a"}, "-ttl 3ms: must be at least 100ms"},
		{[]string{"set", "k", "v", "-px", "1.5ms"}, `invalid value "1.5ms" for flag -px: 1.5ms is not a whole number of milliseconds`},
		{[]string{"set", "k", "v", "-px", "soon"}, `invalid value "soon" for flag -px: not a duration`},
		{[]string{"-timeout", "5", "get", "k"}, `invalid value "5" for flag -timeout: missing unit: write 5s or 5ms`},
	} {
		// No store: a usage error must come before any connection.
		args := append([]string{"-addr", "127.0.0.1:1"}, tc.args...)
		o := sskvRun(t, args...)
		if o.code != exitUsage || o.stdout != "" || !strings.Contains(o.stderr, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 with %q", tc.args, o.code, o.stdout, o.stderr, tc.want)
		}
		if strings.Contains(o.stderr, "parse error") {
			t.Errorf("%q: stderr says only %q", tc.args, "parse error")
		}
	}
}

// help accepts the help flags, as every command does.
func TestHelpFlags(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"help", "-h"}, {"help", "--help"}, {"help", "-help"}, {"-h"}, {"--help"}} {
		o := sskvRun(t, args...)
		if o.code != exitOK || !strings.Contains(o.stdout, "Usage: sskv") || o.stderr != "" {
			t.Errorf("%q: exit %d, stdout %.60q..., stderr %q; want the usage on stdout", args, o.code, o.stdout, o.stderr)
		}
	}
	o := sskvRun(t, "version")
	if o.code != exitOK || !strings.HasPrefix(o.stdout, "sskv ") || !strings.Contains(o.stdout, "github.com/dsslock/dsslock") {
		t.Errorf("version: exit %d, stdout %q", o.code, o.stdout)
	}
}

// Every error has one "sskv:" prefix and names its command once.
func TestErrorPrefixes(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	for _, args := range [][]string{
		{"lock", "", "--", "true"},
		{"lock", "-ttl", "3ms", "x", "--", "true"},
		{"elect", "", "a"},
		{"set", "", "v"},
	} {
		o := sskvRun(t, append([]string{"-addr", srv.Addr()}, args...)...)
		first, _, _ := strings.Cut(o.stderr, "\n")
		for _, twice := range []string{"sskv: sskv:", "lock: lock:", "elect: elect:", "set: set:"} {
			if strings.Contains(first, twice) {
				t.Errorf("%q: stderr %q repeats %q", args, first, twice)
			}
		}
		if !strings.HasPrefix(first, "sskv: ") {
			t.Errorf("%q: stderr %q does not start with sskv:", args, first)
		}
	}
}

// A key written with a fencing token refuses plain writes; the message says
// how to reset it, and -force does, fencing off the old holder.
func TestForceResetsFencedKey(t *testing.T) {
	a := []string{"-addr", startStore(t, localstore.Config{}).Addr()}
	cmd := func(args ...string) []string { return append(append([]string(nil), a...), args...) }

	token := setOK(t, cmd("set", "lock", "me", "-nx", "-px", "10s")...)
	setOK(t, cmd("set", "data", "v1", "-ft", token)...)

	for _, args := range [][]string{{"set", "data", "v2"}, {"del", "data"}, {"vdel", "data", "v1"}} {
		o := sskvRun(t, cmd(args...)...)
		if o.code != exitError || !strings.Contains(o.stderr, "fencing token is required") || !strings.Contains(o.stderr, "sskv "+args[0]+" -force") {
			t.Errorf("%q: exit %d, stderr %q; want the refusal and how to reset the key", args, o.code, o.stderr)
		}
	}
	sskvRun(t, cmd("set", "data", "v2", "-force", "-ft", token)...).want(t, exitUsage, "", "-force and -ft exclude each other")

	forced := setOK(t, cmd("set", "data", "by-operator", "-force")...)
	// The old holder's token is now fenced off.
	sskvRun(t, cmd("set", "data", "late", "-ft", token)...).want(t, exitError, "", "lower version than the fencing token")
	sskvRun(t, cmd("get", "data")...).want(t, exitOK, "by-operator\n(version "+forced+")\n", "")
	sskvRun(t, cmd("del", "data", "-force")...).want(t, exitOK, "DELETED "+forced+"\n", "")
	sskvRun(t, cmd("get", "data")...).want(t, exitNotMet, "", "NOT FOUND")
}
