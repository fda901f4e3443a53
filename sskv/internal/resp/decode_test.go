package resp

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseCommand(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"GET", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", []string{"GET", "k"}},
		{"SET", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n", []string{"SET", "k", "v"}},
		{"SET NEX PX", "*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$4\r\n1000\r\n",
			[]string{"SET", "k", "v", "NEX", "PX", "1000"}},
		{"document lower-case verb", "*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n", []string{"set", "SETKEY2", "VALUE5"}},
		{"NOTIFY SET", "*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n", []string{"NOTIFY", "SET", "VALUE", "abc"}},
		{"NOTIFY DELETE", "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n", []string{"NOTIFY", "DELETE"}},
		{"NOTIFY DEL (document)", "*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n", []string{"NOTIFY", "DEL"}},
		{"binary value with CRLF", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6\r\n\r\n$1\r\n\r\n", []string{"SET", "k", "\r\n$1\r\n"}},
		{"value of only CRLF", "*2\r\n$2\r\n\r\n\r\n$1\r\n\n\r\n", []string{"\r\n", "\n"}},
		{"empty bulk", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n", []string{"SET", "k", ""}},
		{"all bytes", "*1\r\n$4\r\n\x00\xff*$\r\n", []string{"\x00\xff*$"}},
		{"single element", "*1\r\n$0\r\n\r\n", []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			got, err := ParseCommand(in, nil)
			if err != nil {
				t.Fatalf("ParseCommand(%q): %v", tt.in, err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d args %q, want %q", len(got), got, tt.want)
			}
			for i := range got {
				if string(got[i]) != tt.want[i] {
					t.Errorf("arg %d = %q, want %q", i, got[i], tt.want[i])
				}
				if got[i] == nil {
					t.Errorf("arg %d is nil", i)
				}
				if cap(got[i]) != len(got[i]) {
					t.Errorf("arg %d: cap %d != len %d (not clipped)", i, cap(got[i]), len(got[i]))
				}
			}
			if re := AppendCommand(nil, got...); !bytes.Equal(re, in) {
				t.Errorf("re-encoded %q, want %q", re, in)
			}
		})
	}
}

func TestParseCommandAliasesInput(t *testing.T) {
	in := []byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
	args, err := ParseCommand(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	in[len(in)-3] = 'z'
	if string(args[1]) != "z" {
		t.Errorf("arg does not alias input: %q", args[1])
	}
	// Appending to an arg must not overwrite the input (capacity is clipped).
	_ = append(args[0], 'X')
	if string(in[:13]) != "*2\r\n$3\r\nGET\r\n" {
		t.Errorf("append to arg overwrote input: %q", in)
	}
}

func TestParseCommandReusesArgs(t *testing.T) {
	in := []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
	buf := make([][]byte, 5, 8)
	args, err := ParseCommand(in, buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(args) != 3 || &args[0] != &buf[0] {
		t.Errorf("did not reuse args: len %d", len(args))
	}
	// Too small: grows once, to exactly the element count.
	args, err = ParseCommand(in, make([][]byte, 0, 1))
	if err != nil || len(args) != 3 || cap(args) != 3 {
		t.Errorf("grow: len %d cap %d err %v", len(args), cap(args), err)
	}
	// On error the slice comes back empty and usable.
	args, err = ParseCommand([]byte("*1\r\n$1\r\nx"), buf)
	if err == nil || len(args) != 0 || cap(args) != cap(buf) {
		t.Errorf("error: len %d cap %d err %v", len(args), cap(args), err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		args, err = ParseCommand(in, args)
	})
	if allocs != 0 || err != nil {
		t.Errorf("got %v allocs per run (err %v), want 0", allocs, err)
	}
}

func TestParseCommandMaxArgs(t *testing.T) {
	mk := func(n int) []byte {
		args := make([][]byte, n)
		return AppendCommand(nil, args...)
	}
	if args, err := ParseCommand(mk(MaxArgs), nil); err != nil || len(args) != MaxArgs {
		t.Errorf("MaxArgs elements: %d, %v", len(args), err)
	}
	if _, err := ParseCommand(mk(MaxArgs+1), nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("MaxArgs+1 elements: got %v, want ErrTooLarge", err)
	}
}

func TestParseCommandErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"empty", "", ErrSyntax},
		{"not an array", "$3\r\nGET\r\n", ErrSyntax},
		{"simple string", "+OK\r\n", ErrSyntax},
		{"inline command", "GET k\r\n", ErrSyntax},
		{"empty array", "*0\r\n", ErrSyntax},
		{"null array", "*-1\r\n", ErrSyntax},
		{"negative count", "*-2\r\n", ErrSyntax},
		{"count plus sign", "*+1\r\n$1\r\nk\r\n", ErrSyntax},
		{"count leading zero", "*01\r\n$1\r\nk\r\n", ErrSyntax},
		{"count minus zero", "*-0\r\n", ErrSyntax},
		{"count no digits", "*\r\n$1\r\nk\r\n", ErrSyntax},
		{"count not digits", "*x\r\n", ErrSyntax},
		{"count trailing junk", "*1x\r\n$1\r\nk\r\n", ErrSyntax},
		{"count missing CRLF", "*1", ErrSyntax},
		{"count LF only", "*1\n$1\r\nk\r\n", ErrSyntax},
		{"count CR only", "*1\r$1\r\nk\r\n", ErrSyntax},
		{"count over MaxArgs", "*65\r\n", ErrTooLarge},
		{"count huge", "*99999999999999999999999999\r\n", ErrTooLarge},
		{"count beyond input", "*3\r\n$3\r\nSET\r\n", ErrTooLarge},
		{"element not bulk", "*1\r\n+OKOK\r\n", ErrSyntax},
		{"element integer", "*1\r\n:1234\r\n", ErrSyntax},
		{"element array", "*1\r\n*1\r\n$0\r\n\r\n", ErrSyntax},
		{"null element", "*2\r\n$3\r\nGET\r\n$-1\r\n", ErrSyntax},
		{"negative bulk length", "*1\r\n$-2\r\nab\r\n", ErrSyntax},
		{"bulk length plus", "*1\r\n$+1\r\nk\r\n", ErrSyntax},
		{"bulk length leading zero", "*1\r\n$01\r\nk\r\n", ErrSyntax},
		{"bulk length minus zero", "*1\r\n$-0\r\n\r\n", ErrSyntax},
		{"bulk length empty", "*1\r\n$\r\nk\r\n", ErrSyntax},
		{"bulk length junk", "*1\r\n$1k\r\nk\r\n", ErrSyntax},
		{"bulk length beyond input", "*1\r\n$10\r\nshort\r\n", ErrTooLarge},
		{"bulk length overflow", "*1\r\n$99999999999999999999999999\r\nk\r\n", ErrTooLarge},
		{"bulk length max int64", "*1\r\n$9223372036854775807\r\nk\r\n", ErrTooLarge},
		{"bulk missing final CRLF", "*1\r\n$2\r\nkk", ErrSyntax},
		{"short element", "*1\r\n$1\r\nk", ErrTooLarge},
		{"bulk truncated CRLF", "*1\r\n$1\r\nk\r", ErrSyntax},
		{"bulk payload longer than length", "*1\r\n$1\r\nkk\r\n", ErrSyntax},
		{"bulk wrong terminator", "*1\r\n$1\r\nk\n\r", ErrSyntax},
		{"trailing bytes", "*1\r\n$1\r\nk\r\nX", ErrSyntax},
		{"trailing CRLF", "*1\r\n$1\r\nk\r\n\r\n", ErrSyntax},
		{"two commands", "*1\r\n$1\r\nk\r\n*1\r\n$1\r\nk\r\n", ErrSyntax},
		{"fewer elements than count", "*2\r\n$1\r\nk\r\n$0\r\n", ErrTooLarge},
		{"last element truncated", "*2\r\n$1\r\nk\r\n$0\r\n\r", ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := ParseCommand([]byte(tt.in), nil)
			if !errors.Is(err, tt.want) {
				t.Fatalf("ParseCommand(%q) error = %v, want %v", tt.in, err, tt.want)
			}
			if len(args) != 0 {
				t.Errorf("got %d args with an error", len(args))
			}
			if other := otherErr(tt.want); errors.Is(err, other) {
				t.Errorf("error %v also matches %v", err, other)
			}
			if !strings.Contains(err.Error(), "at offset ") {
				t.Errorf("error %q has no offset", err)
			}
		})
	}
}

func otherErr(e error) error {
	if e == ErrSyntax {
		return ErrTooLarge
	}
	return ErrSyntax
}

func TestParseReply(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		kind  Kind
		str   string
		n     int64
		elems []string // "<nil>" stands for a nil element
	}{
		// What the real service sends.
		{"OK", "+OK\r\n", KindSimple, "OK", 0, nil},
		{"empty simple", "+\r\n", KindSimple, "", 0, nil},
		{"int 1", ":1\r\n", KindInt, "", 1, nil},
		{"int 0", ":0\r\n", KindInt, "", 0, nil},
		{"int -1", ":-1\r\n", KindInt, "", -1, nil},
		{"int -0", ":-0\r\n", KindInt, "", 0, nil},
		{"int leading zeros", ":007\r\n", KindInt, "", 7, nil},
		{"int max", ":9223372036854775807\r\n", KindInt, "", math.MaxInt64, nil},
		{"int min", ":-9223372036854775808\r\n", KindInt, "", math.MinInt64, nil},
		{"null bulk", "$-1\r\n", KindNull, "", 0, nil},
		{"RESP3 null", "_\r\n", KindNull, "", 0, nil},
		{"null array", "*-1\r\n", KindNull, "", 0, nil},
		{"bulk", "$4\r\n1234\r\n", KindBulk, "1234", 0, nil},
		{"empty bulk", "$0\r\n\r\n", KindBulk, "", 0, nil},
		{"binary bulk with CRLF", "$6\r\n\r\n$1\r\n\r\n", KindBulk, "\r\n$1\r\n", 0, nil},
		{"bulk of CRLF", "$2\r\n\r\n\r\n", KindBulk, "\r\n", 0, nil},
		{"error", "-ERR syntax error\r\n", KindError, "syntax error", 0, nil},
		{"error colon space", "-ERR: syntax error\r\n", KindError, "syntax error", 0, nil},
		{"error colon", "-ERR:syntax error\r\n", KindError, "syntax error", 0, nil},
		{"error bare ERR", "-ERR\r\n", KindError, "", 0, nil},
		{"error ERR space only", "-ERR \r\n", KindError, "", 0, nil},
		{"error ERR colon only", "-ERR:\r\n", KindError, "", 0, nil},
		{"error keeps extra space", "-ERR  x\r\n", KindError, " x", 0, nil},
		{"error other code", "-WRONGTYPE bad\r\n", KindError, "WRONGTYPE bad", 0, nil},
		{"error ERR-like word", "-ERRANT x\r\n", KindError, "ERRANT x", 0, nil},
		{"error empty", "-\r\n", KindError, "", 0, nil},
		{"error -2 is an error", "-2\r\n", KindError, "2", 0, nil},
		{"error unknown message", "-ERR the quota has been exceeded\r\n", KindError, "the quota has been exceeded", 0, nil},
		{"array", "*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n", KindArray, "", 0, []string{"NOTIFY", "DELETE"}},
		{"array with null and empty", "*3\r\n$1\r\na\r\n$-1\r\n$0\r\n\r\n", KindArray, "", 0, []string{"a", "<nil>", ""}},
		{"empty array", "*0\r\n", KindArray, "", 0, []string{}},

		// The public document's forms.
		{"doc bare -1", "-1\r\n", KindInt, "", -1, nil},
		{"doc bare -1 no CRLF", "-1", KindInt, "", -1, nil},
		{"doc OK no CRLF", "+OK", KindSimple, "OK", 0, nil},
		{"doc int no CRLF", ":1", KindInt, "", 1, nil},
		{"doc error no CRLF", "-ERR syntax error", KindError, "syntax error", 0, nil},
		{"doc error colon no CRLF", "-ERR: not authorized", KindError, "not authorized", 0, nil},
		{"doc null no CRLF", "$-1", KindNull, "", 0, nil},
		{"doc RESP3 null no CRLF", "_", KindNull, "", 0, nil},
		{"doc null array no CRLF", "*-1", KindNull, "", 0, nil},
		{"doc bulk no final CRLF", "$4\r\n1234", KindBulk, "1234", 0, nil},
		{"doc empty bulk no final CRLF", "$0\r\n", KindBulk, "", 0, nil},
		{"doc binary bulk no final CRLF", "$2\r\n\r\n", KindBulk, "\r\n", 0, nil},
		{"doc empty simple no CRLF", "+", KindSimple, "", 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := []byte(tt.in)
			r, err := ParseReply(in)
			if err != nil {
				t.Fatalf("ParseReply(%q): %v", tt.in, err)
			}
			if r.Kind != tt.kind {
				t.Fatalf("kind = %v, want %v", r.Kind, tt.kind)
			}
			if string(r.Str) != tt.str {
				t.Errorf("Str = %q, want %q", r.Str, tt.str)
			}
			if cap(r.Str) != len(r.Str) {
				t.Errorf("Str capacity not clipped")
			}
			switch tt.kind {
			case KindBulk:
				if r.Str == nil {
					t.Errorf("bulk Str is nil")
				}
			case KindInt, KindNull, KindArray:
				if r.Str != nil {
					t.Errorf("Str = %q, want nil", r.Str)
				}
			}
			if r.Int != tt.n {
				t.Errorf("Int = %d, want %d", r.Int, tt.n)
			}
			if len(r.Elems) != len(tt.elems) {
				t.Fatalf("Elems = %q, want %q", r.Elems, tt.elems)
			}
			for i, e := range tt.elems {
				if e == "<nil>" {
					if r.Elems[i] != nil {
						t.Errorf("elem %d = %q, want nil", i, r.Elems[i])
					}
					continue
				}
				if r.Elems[i] == nil || string(r.Elems[i]) != e {
					t.Errorf("elem %d = %q, want %q", i, r.Elems[i], e)
				}
			}
		})
	}
}

func TestParseReplyEncoderForms(t *testing.T) {
	// Everything the encoder writes decodes back to what was written.
	if r, err := ParseReply(AppendSimple(nil, "OK")); err != nil || r.Kind != KindSimple || string(r.Str) != "OK" {
		t.Errorf("simple: %+v %v", r, err)
	}
	for _, msg := range []string{"syntax error", "", "a fencing token is required for this request", "ERR x", "1", ": x"} {
		r, err := ParseReply(AppendError(nil, msg))
		if err != nil || r.Kind != KindError || string(r.Str) != msg {
			t.Errorf("error %q: %+v %v", msg, r, err)
		}
	}
	for _, n := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64} {
		r, err := ParseReply(AppendInt(nil, n))
		if err != nil || r.Kind != KindInt || r.Int != n {
			t.Errorf("int %d: %+v %v", n, r, err)
		}
	}
	if r, err := ParseReply(AppendNull(nil)); err != nil || r.Kind != KindNull {
		t.Errorf("null: %+v %v", r, err)
	}
	for _, v := range []string{"", "1234", "\r\n", strings.Repeat("x", 1000)} {
		r, err := ParseReply(AppendBulkString(nil, v))
		if err != nil || r.Kind != KindBulk || string(r.Str) != v {
			t.Errorf("bulk %q: %+v %v", v, r, err)
		}
	}
}

func TestParseReplyErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"empty", "", ErrSyntax},
		{"unknown type", "?x\r\n", ErrSyntax},
		{"bare text", "OK\r\n", ErrSyntax},
		{"RESP3 double", ",1.5\r\n", ErrSyntax},
		{"RESP3 map", "%1\r\n", ErrSyntax},
		{"RESP3 boolean", "#t\r\n", ErrSyntax},
		{"simple trailing bytes", "+OK\r\nX", ErrSyntax},
		{"simple two replies", "+OK\r\n+OK\r\n", ErrSyntax},
		{"simple trailing CRLF", "+OK\r\n\r\n", ErrSyntax},
		{"simple lone CR", "+O\rK\r\n", ErrSyntax},
		{"simple lone LF", "+O\nK\r\n", ErrSyntax},
		{"simple LF terminator", "+OK\n", ErrSyntax},
		{"simple truncated CRLF", "+OK\r", ErrSyntax},
		{"error trailing bytes", "-ERR x\r\nY", ErrSyntax},
		{"error lone LF", "-ERR x\ny\r\n", ErrSyntax},
		{"int empty", ":\r\n", ErrSyntax},
		{"int empty no CRLF", ":", ErrSyntax},
		{"int minus only", ":-\r\n", ErrSyntax},
		{"int plus", ":+1\r\n", ErrSyntax},
		{"int space", ": 1\r\n", ErrSyntax},
		{"int junk", ":1x\r\n", ErrSyntax},
		{"int double minus", ":--1\r\n", ErrSyntax},
		{"int overflow", ":9223372036854775808\r\n", ErrSyntax},
		{"int underflow", ":-9223372036854775809\r\n", ErrSyntax},
		{"int huge", ":99999999999999999999999\r\n", ErrSyntax},
		{"int trailing bytes", ":1\r\n:1\r\n", ErrSyntax},
		{"int lone CR", ":1\r", ErrSyntax},
		{"RESP3 null with text", "_x\r\n", ErrSyntax},
		{"RESP3 null trailing", "_\r\nx", ErrSyntax},
		{"bulk no length", "$\r\n", ErrSyntax},
		{"bulk length plus", "$+4\r\n1234\r\n", ErrSyntax},
		{"bulk length leading zero", "$04\r\n1234\r\n", ErrSyntax},
		{"bulk length minus zero", "$-0\r\n", ErrSyntax},
		{"bulk negative length", "$-2\r\n", ErrSyntax},
		{"bulk -1 with junk", "$-1x\r\n", ErrSyntax},
		{"bulk -10", "$-10\r\n", ErrSyntax},
		{"bulk length junk", "$4x\r\n1234\r\n", ErrSyntax},
		{"bulk length no CRLF", "$4", ErrSyntax},
		{"bulk length LF only", "$4\n1234\r\n", ErrSyntax},
		{"bulk beyond input", "$7\r\n1234\r\n", ErrTooLarge},
		{"bulk length one too long", "$5\r\n1234\r\n", ErrSyntax},
		{"bulk beyond input, no CRLF", "$5\r\n1234", ErrTooLarge},
		{"bulk length overflow", "$99999999999999999999999\r\n", ErrTooLarge},
		{"bulk payload too long", "$3\r\n1234\r\n", ErrSyntax},
		{"bulk truncated CRLF", "$4\r\n1234\r", ErrSyntax},
		{"bulk wrong terminator", "$4\r\n1234\n\r", ErrSyntax},
		{"bulk trailing bytes", "$4\r\n1234\r\nX", ErrSyntax},
		{"null trailing bytes", "$-1\r\nX", ErrSyntax},
		{"null truncated CRLF", "$-1\r", ErrSyntax},
		{"array over MaxArgs", "*65\r\n", ErrTooLarge},
		{"array count beyond input", "*2\r\n$1\r\na\r\n", ErrTooLarge},
		{"array negative count", "*-2\r\n", ErrSyntax},
		{"array count leading zero", "*02\r\n", ErrSyntax},
		{"array non-bulk element", "*1\r\n:12\r\n", ErrSyntax},
		{"array nested", "*1\r\n*0\r\n\r\n", ErrSyntax},
		{"array element without final CRLF", "*1\r\n$1\r\na", ErrSyntax},
		{"array null element without CRLF", "*1\r\n$-1xx", ErrSyntax},
		{"array element beyond input", "*1\r\n$9\r\nab\r\n", ErrTooLarge},
		{"array trailing bytes", "*1\r\n$1\r\na\r\nX", ErrSyntax},
		{"null array trailing bytes", "*-1\r\nX", ErrSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseReply([]byte(tt.in))
			if !errors.Is(err, tt.want) {
				t.Fatalf("ParseReply(%q) = %+v, error %v, want %v", tt.in, r, err, tt.want)
			}
			if errors.Is(err, otherErr(tt.want)) {
				t.Errorf("error %v matches both sentinels", err)
			}
			if r.Kind != 0 || r.Str != nil || r.Int != 0 || r.Elems != nil {
				t.Errorf("non-zero Reply with error: %+v", r)
			}
			if !strings.Contains(err.Error(), "at offset ") {
				t.Errorf("error %q has no offset", err)
			}
		})
	}
}

func TestParseReplyMaxArgs(t *testing.T) {
	in := AppendArrayHeader(nil, MaxArgs)
	for i := 0; i < MaxArgs; i++ {
		in = AppendNull(in)
	}
	r, err := ParseReply(in)
	if err != nil || r.Kind != KindArray || len(r.Elems) != MaxArgs {
		t.Errorf("MaxArgs nulls: kind %v, %d elems, %v", r.Kind, len(r.Elems), err)
	}
}

func TestParseReplyZeroAllocs(t *testing.T) {
	inputs := []string{"+OK\r\n", ":-1\r\n", "-1", "-ERR: syntax error\r\n", "$-1\r\n", "_\r\n",
		"$4\r\n1234\r\n", "*-1\r\n", "*0\r\n"}
	for _, in := range inputs {
		b := []byte(in)
		allocs := testing.AllocsPerRun(100, func() {
			if _, err := ParseReply(b); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("ParseReply(%q): %v allocs, want 0", in, allocs)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	_, err := ParseCommand([]byte("*1\r\n$1\r\nk!"), nil)
	want := "resp: syntax error: expected CRLF at offset 9"
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
	_, err = ParseReply([]byte("$10\r\nx\r\n"))
	want = "resp: length exceeds limit: bulk length exceeds the remaining input at offset 1"
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
}

func TestKindString(t *testing.T) {
	want := map[Kind]string{
		KindSimple: "simple", KindError: "error", KindInt: "int", KindBulk: "bulk",
		KindNull: "null", KindArray: "array", 0: "Kind(0)", 200: "Kind(200)",
	}
	for k, s := range want {
		if k.String() != s {
			t.Errorf("Kind(%d).String() = %q, want %q", uint8(k), k.String(), s)
		}
	}
}

func TestParseIntMatchesStrconv(t *testing.T) {
	for _, s := range []string{"0", "-0", "1", "-1", "42", "007", "9223372036854775807", "-9223372036854775808",
		"9223372036854775808", "-9223372036854775809", "18446744073709551616", "", "-", "+1", "1-", " 1", "1 "} {
		got, ok := parseInt([]byte(s))
		want, err := strconv.ParseInt(s, 10, 64)
		wantOK := err == nil && !strings.HasPrefix(s, "+")
		if ok != wantOK || (ok && got != want) {
			t.Errorf("parseInt(%q) = %d, %v; want %d, %v", s, got, ok, want, wantOK)
		}
	}
}
