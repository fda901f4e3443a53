package hlc_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

func TestParseValid(t *testing.T) {
	tests := []struct {
		in   string
		want hlc.Timestamp
	}{
		{"1696374425000:1:StateStore", hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}},
		{"001696374425000:00001:StateStore", hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}},
		{"1696374425000:0:Client1", hlc.Timestamp{Wall: 1696374425000, Node: "Client1"}},
		{"0:0:n", hlc.Timestamp{Node: "n"}},
		{"000000000000000:00000:n", hlc.Timestamp{Node: "n"}},
		{"0000000000000000000000000000000000000001:000000000000000000002:n", hlc.Timestamp{Wall: 1, Counter: 2, Node: "n"}},
		{"9223372036854775807:2147483647:n", hlc.Timestamp{Wall: math.MaxInt64, Counter: hlc.MaxCounter, Node: "n"}},
		{"1:2:node-with.punct/and_more", hlc.Timestamp{Wall: 1, Counter: 2, Node: "node-with.punct/and_more"}},
		{"1:2:nöde", hlc.Timestamp{Wall: 1, Counter: 2, Node: "nöde"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := hlc.Parse(tt.in)
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v, nil", tt.in, got, err, tt.want)
			}
			got, err = hlc.ParseBytes([]byte(tt.in))
			if err != nil || got != tt.want {
				t.Fatalf("ParseBytes(%q) = %+v, %v; want %+v, nil", tt.in, got, err, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name, in, reason string // reason: substring expected in the error
	}{
		{"empty", "", "empty timestamp"},
		{"one part", "1696374425000", "got 1"},
		{"two parts", "1696374425000:1", "got 2"},
		{"four parts", "1:2:node:extra", "more than 3 parts"},
		{"trailing colon", "1:2:node:", "more than 3 parts"},
		{"empty node", "1:2:", "empty node id"},
		{"only colons", "::", "wall"},
		{"empty wall", ":1:n", "wall"},
		{"empty counter", "1::n", "counter"},
		{"letters in wall", "12a:1:n", "wall"},
		{"letters in counter", "1:x:n", "counter"},
		{"hex wall", "0x10:1:n", "wall"},
		{"plus wall", "+1:1:n", "wall"},
		{"minus wall", "-1:1:n", "wall"},
		{"plus counter", "1:+1:n", "counter"},
		{"minus counter", "1:-1:n", "counter"},
		{"wall overflows int64", "9223372036854775808:1:n", "wall"},
		{"wall far too big", "99999999999999999999999999:1:n", "wall"},
		{"counter is 2^31", "1:2147483648:n", "counter"},
		{"counter overflows uint32", "1:4294967296:n", "counter"},
		{"counter far too big", "1:99999999999999999999999:n", "counter"},
		{"leading space", " 1:1:n", "wall"},
		{"trailing newline", "1:1:n\n", "control"},
		{"space in wall", "1 :1:n", "wall"},
		{"space in counter", "1: 1:n", "counter"},
		{"tab in node", "1:1:a\tb", "control"},
		{"NUL in node", "1:1:a\x00", "control"},
		{"DEL in node", "1:1:a\x7f", "control"},
		{"decimal point", "1.5:1:n", "wall"},
		{"unicode digit", "١:1:n", "wall"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, parse := range []func(string) (hlc.Timestamp, error){
				hlc.Parse,
				func(s string) (hlc.Timestamp, error) { return hlc.ParseBytes([]byte(s)) },
			} {
				got, err := parse(tt.in)
				if !errors.Is(err, hlc.ErrMalformed) {
					t.Fatalf("parse(%q) error = %v; want ErrMalformed", tt.in, err)
				}
				if !strings.Contains(err.Error(), tt.reason) {
					t.Errorf("parse(%q) error = %q; want it to mention %q", tt.in, err, tt.reason)
				}
				if got != (hlc.Timestamp{}) {
					t.Errorf("parse(%q) = %+v; want the zero Timestamp", tt.in, got)
				}
			}
		})
	}
}

func TestParseErrorQuotesTruncatedInput(t *testing.T) {
	_, err := hlc.Parse("1:1:" + strings.Repeat("x", 1000) + ":")
	if err == nil {
		t.Fatal("no error")
	}
	if msg := err.Error(); len(msg) > 200 || !strings.Contains(msg, `"1:1:xxx`) || !strings.HasSuffix(msg, `" (truncated)`) {
		t.Errorf("error = %q; want a short message quoting a prefix of the input", msg)
	}
}

func TestString(t *testing.T) {
	tests := []struct {
		ts   hlc.Timestamp
		want string
	}{
		{hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}, "001696374425000:00001:StateStore"},
		{hlc.Timestamp{Wall: 1, Node: "n"}, "000000000000001:00000:n"},
		{hlc.Timestamp{Wall: 123456789012345, Counter: 12345, Node: "n"}, "123456789012345:12345:n"},
		{hlc.Timestamp{Wall: 1234567890123456, Counter: 123456, Node: "n"}, "1234567890123456:123456:n"},
		{hlc.Timestamp{Wall: math.MaxInt64, Counter: hlc.MaxCounter, Node: "n"}, "9223372036854775807:2147483647:n"},
		// Invalid values are formatted anyway, as fmt's %015d:%05d:%s would.
		{hlc.Timestamp{}, "000000000000000:00000:"},
		{hlc.Timestamp{Wall: -5, Counter: math.MaxUint32, Node: "a:b"}, "-00000000000005:4294967295:a:b"},
		{hlc.Timestamp{Wall: math.MinInt64, Node: "n"}, "-9223372036854775808:00000:n"},
	}
	for _, tt := range tests {
		if got := tt.ts.String(); got != tt.want {
			t.Errorf("%#v.String() = %q; want %q", tt.ts, got, tt.want)
		}
	}
}

func TestAppendTextAndMarshal(t *testing.T) {
	ts := hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}
	const want = "001696374425000:00001:StateStore"

	b, err := ts.AppendText([]byte("v="))
	if err != nil || string(b) != "v="+want {
		t.Fatalf("AppendText = %q, %v; want %q", b, err, "v="+want)
	}
	m, err := ts.MarshalText()
	if err != nil || string(m) != want {
		t.Fatalf("MarshalText = %q, %v; want %q", m, err, want)
	}
	var u hlc.Timestamp
	if err := u.UnmarshalText([]byte("1696374425000:1:StateStore")); err != nil || u != ts {
		t.Fatalf("UnmarshalText = %+v, %v; want %+v", u, err, ts)
	}

	// JSON goes through the text methods.
	type doc struct {
		V hlc.Timestamp `json:"v"`
	}
	j, err := json.Marshal(doc{ts})
	if err != nil || string(j) != `{"v":"`+want+`"}` {
		t.Fatalf("json.Marshal = %s, %v", j, err)
	}
	var d doc
	if err := json.Unmarshal(j, &d); err != nil || d.V != ts {
		t.Fatalf("json.Unmarshal = %+v, %v", d, err)
	}
}

func TestAppendTextRejectsInvalid(t *testing.T) {
	for _, ts := range []hlc.Timestamp{
		{},
		{Wall: -1, Node: "n"},
		{Counter: hlc.MaxCounter + 1, Node: "n"},
		{Node: "a:b"},
		{Node: "a\nb"},
	} {
		b, err := ts.AppendText([]byte("keep"))
		if !errors.Is(err, hlc.ErrMalformed) || string(b) != "keep" {
			t.Errorf("%#v.AppendText = %q, %v; want %q, ErrMalformed", ts, b, err, "keep")
		}
		if m, err := ts.MarshalText(); !errors.Is(err, hlc.ErrMalformed) || m != nil {
			t.Errorf("%#v.MarshalText = %q, %v; want nil, ErrMalformed", ts, m, err)
		}
	}
}

func TestUnmarshalTextFailureLeavesValue(t *testing.T) {
	orig := hlc.Timestamp{Wall: 7, Counter: 8, Node: "n"}
	u := orig
	if err := u.UnmarshalText([]byte("7:8")); !errors.Is(err, hlc.ErrMalformed) {
		t.Fatalf("UnmarshalText error = %v; want ErrMalformed", err)
	}
	if u != orig {
		t.Errorf("UnmarshalText changed the value to %+v", u)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		ts hlc.Timestamp
		ok bool
	}{
		{hlc.Timestamp{Wall: 1, Counter: 1, Node: "n"}, true},
		{hlc.Timestamp{Node: "n"}, true},
		{hlc.Timestamp{Wall: math.MaxInt64, Counter: hlc.MaxCounter, Node: "n"}, true},
		{hlc.Timestamp{}, false},
		{hlc.Timestamp{Wall: 1, Counter: 1}, false},
		{hlc.Timestamp{Wall: -1, Node: "n"}, false},
		{hlc.Timestamp{Counter: hlc.MaxCounter + 1, Node: "n"}, false},
		{hlc.Timestamp{Node: "a:b"}, false},
		{hlc.Timestamp{Node: "a\n"}, false},
	}
	for _, tt := range tests {
		err := tt.ts.Validate()
		if tt.ok && err != nil {
			t.Errorf("%#v.Validate() = %v; want nil", tt.ts, err)
		}
		if !tt.ok && !errors.Is(err, hlc.ErrMalformed) {
			t.Errorf("%#v.Validate() = %v; want ErrMalformed", tt.ts, err)
		}
	}
}

func TestValidateNode(t *testing.T) {
	for node, ok := range map[string]bool{
		"StateStore": true, "client-1/x": true, "é": true, "line 1 gateway": true,
		"": false, ":": false, "a:": false, "a\r": false,
	} {
		if err := hlc.ValidateNode(node); (err == nil) != ok || (err != nil && !errors.Is(err, hlc.ErrMalformed)) {
			t.Errorf("ValidateNode(%q) = %v; want ok=%v", node, err, ok)
		}
	}
}

func TestCompare(t *testing.T) {
	// Each entry is strictly less than the next.
	ordered := []hlc.Timestamp{
		{},
		{Node: "a"},
		{Counter: 1, Node: "a"},
		{Counter: 1, Node: "b"},
		{Counter: 1, Node: "ba"},
		{Counter: hlc.MaxCounter, Node: "a"},
		{Wall: 1, Node: "A"},
		{Wall: 1, Node: "a"}, // byte order: 'A' < 'a'
		{Wall: 1696374425000, Counter: 0, Node: "Client1"},
		{Wall: 1696374425000, Counter: 1, Node: "StateStore"},
		{Wall: 1696374425001, Counter: 0, Node: "A"},
		{Wall: math.MaxInt64, Counter: hlc.MaxCounter, Node: "\xff"},
	}
	for i, a := range ordered {
		for j, b := range ordered {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = +1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%v.Compare(%v) = %d; want %d", a, b, got, want)
			}
			if got := a.Before(b); got != (want < 0) {
				t.Errorf("%v.Before(%v) = %v", a, b, got)
			}
			if got := a.After(b); got != (want > 0) {
				t.Errorf("%v.After(%v) = %v", a, b, got)
			}
			if (a == b) != (want == 0) {
				t.Errorf("%v == %v is %v; Compare says %d", a, b, a == b, want)
			}
		}
	}
}

func TestIsZero(t *testing.T) {
	if !(hlc.Timestamp{}).IsZero() {
		t.Error("zero Timestamp: IsZero() = false")
	}
	for _, ts := range []hlc.Timestamp{{Wall: 1}, {Counter: 1}, {Node: "n"}} {
		if ts.IsZero() {
			t.Errorf("%#v.IsZero() = true", ts)
		}
	}
}

func TestTime(t *testing.T) {
	ts := hlc.Timestamp{Wall: 1696374425123, Counter: 9, Node: "n"}
	want := time.Date(2023, time.October, 3, 23, 7, 5, 123e6, time.UTC)
	if got := ts.Time(); !got.Equal(want) {
		t.Errorf("Time() = %v; want %v", got, want)
	}
	if got := (hlc.Timestamp{}).Time(); !got.Equal(time.Unix(0, 0)) {
		t.Errorf("zero Time() = %v; want the Unix epoch", got)
	}
}

func TestAllocations(t *testing.T) {
	in := []byte("001696374425000:00001:StateStore")
	if n := testing.AllocsPerRun(100, func() {
		if _, err := hlc.ParseBytes(in); err != nil {
			t.Fatal(err)
		}
	}); n > 1 {
		t.Errorf("ParseBytes: %v allocations; want <= 1", n)
	}
	s := string(in)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := hlc.Parse(s); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Parse: %v allocations; want 0", n)
	}
	ts := hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := ts.AppendText(buf[:0]); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("AppendText: %v allocations; want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = ts.String() }); n > 1 {
		t.Errorf("String: %v allocations; want <= 1", n)
	}
}
