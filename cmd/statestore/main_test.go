package main

import (
	"flag"
	"io"
	"strconv"
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
