package hlc_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

// FuzzParse checks that Parse never panics, that it fails only with
// ErrMalformed, that ParseBytes agrees with it, and that anything it accepts
// round-trips: String (and the text methods) produce a string that parses to
// an equal Timestamp and is itself in canonical form.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"1696374425000:1:StateStore", // the protocol document's example
		"1696374425000:0:Client1",
		"001696374425000:00001:StateStore",
		"0:0:n",
		"9223372036854775807:2147483647:n",
		"0000000000000000000000000001:0000000000000002:n",
		"",
		":",
		"::",
		"1:2",
		"1:2:",
		"1:2:n:x",
		"+1:1:n",
		"1:-1:n",
		" 1:1:n",
		"1:1:n\n",
		"1:1:a b",
		"9223372036854775808:1:n",
		"1:2147483648:n",
		"1:4294967296:n",
		"x:1:n",
		"1:1:\xff\xfe",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := hlc.Parse(s)
		tb, errb := hlc.ParseBytes([]byte(s))
		if tb != ts || (err == nil) != (errb == nil) {
			t.Fatalf("Parse(%q) = %v, %v but ParseBytes = %v, %v", s, ts, err, tb, errb)
		}
		if err != nil {
			if !errors.Is(err, hlc.ErrMalformed) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrMalformed", s, err)
			}
			if !ts.IsZero() {
				t.Fatalf("Parse(%q) returned %v with its error", s, ts)
			}
			return
		}
		if err := ts.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %v, which does not validate: %v", s, ts, err)
		}

		str := ts.String()
		ts2, err := hlc.Parse(str)
		if err != nil {
			t.Fatalf("Parse(%q).String() = %q does not parse: %v", s, str, err)
		}
		if ts2 != ts {
			t.Fatalf("Parse(%q) = %#v, but Parse(String()) = %#v", s, ts, ts2)
		}
		if ts2.Compare(ts) != 0 {
			t.Fatalf("%v.Compare(itself) != 0", ts)
		}
		if str2 := ts2.String(); str2 != str {
			t.Fatalf("String() not canonical: %q then %q", str, str2)
		}
		b, err := ts.AppendText(nil)
		if err != nil || string(b) != str {
			t.Fatalf("AppendText = %q, %v; want %q", b, err, str)
		}
		m, err := ts.MarshalText()
		if err != nil || !bytes.Equal(m, b) {
			t.Fatalf("MarshalText = %q, %v; want %q", m, err, str)
		}
		var u hlc.Timestamp
		if err := u.UnmarshalText(m); err != nil || u != ts {
			t.Fatalf("UnmarshalText(%q) = %v, %v; want %v", m, u, err, ts)
		}
	})
}
