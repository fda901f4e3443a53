package resp

import (
	"bytes"
	"errors"
	"testing"
)

// seeds are valid and invalid payloads of every kind, shared by both fuzz
// targets.
var seeds = []string{
	// Requests and notifications.
	"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
	"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
	"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$4\r\n1000\r\n",
	"*3\r\n$4\r\nVDEL\r\n$1\r\nk\r\n$2\r\n\r\n\r\n",
	"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n",
	"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n",
	"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
	"*1\r\n$0\r\n\r\n",
	"*3\r\n$1\r\na\r\n$-1\r\n$0\r\n\r\n",
	"*0\r\n",
	"*-1\r\n",
	"*-1",
	"*65\r\n",
	"*01\r\n$1\r\nk\r\n",
	"*1\r\n$01\r\nk\r\n",
	"*1\r\n$9223372036854775807\r\nk\r\n",
	"*1\r\n$99999999999999999999999\r\nk\r\n",
	"*1\r\n$1\r\nk",
	"*1\r\n$1\r\nk\r\nX",
	"*2\r\n$1\r\nk\r\n",
	// Replies.
	"+OK\r\n", "+OK", "+\r\n",
	":1\r\n", ":0\r\n", ":-1\r\n", ":1", ":-9223372036854775808\r\n", ":9223372036854775808\r\n", ":+1\r\n", ":\r\n",
	"-1\r\n", "-1", "-2\r\n",
	"-ERR syntax error\r\n", "-ERR: syntax error\r\n", "-ERR:syntax error", "-ERR\r\n", "-\r\n",
	"$-1\r\n", "$-1", "$-2\r\n", "_\r\n", "_",
	"$4\r\n1234\r\n", "$4\r\n1234", "$0\r\n\r\n", "$0\r\n", "$5\r\n1234\r\n", "$2\r\n\r\n\r\n",
	"", "\r\n", "?\r\n", "+O\rK\r\n", "+OK\n", "+OK\r\nX",
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	reuse := make([][]byte, 0, MaxArgs)
	f.Fuzz(func(t *testing.T, b []byte) {
		args, err := ParseCommand(b, nil)
		args2, err2 := ParseCommand(b, reuse)
		if (err == nil) != (err2 == nil) || len(args) != len(args2) {
			t.Fatalf("result depends on the args slice: %v vs %v", err, err2)
		}
		if err != nil {
			if errors.Is(err, ErrSyntax) == errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v must wrap exactly one of ErrSyntax, ErrTooLarge", err)
			}
			if len(args) != 0 {
				t.Fatalf("%d args returned with error %v", len(args), err)
			}
			return
		}
		if len(args) < 1 || len(args) > MaxArgs {
			t.Fatalf("accepted %d args", len(args))
		}
		for i, a := range args {
			if a == nil || cap(a) != len(a) {
				t.Fatalf("arg %d: nil or capacity not clipped", i)
			}
			if !bytes.Equal(a, args2[i]) {
				t.Fatalf("arg %d differs with a reused args slice", i)
			}
		}
		// Round trip: what parses re-encodes to the identical bytes.
		if re := AppendCommand(nil, args...); !bytes.Equal(re, b) {
			t.Fatalf("re-encoded %q, input %q", re, b)
		}
		if n := CommandLen(args...); n != len(b) {
			t.Fatalf("CommandLen = %d, input length %d", n, len(b))
		}
		// A command is also a valid array reply with the same elements.
		r, err := ParseReply(b)
		if err != nil || r.Kind != KindArray || len(r.Elems) != len(args) {
			t.Fatalf("ParseReply of a valid command: %+v, %v", r, err)
		}
		for i := range args {
			if !bytes.Equal(r.Elems[i], args[i]) {
				t.Fatalf("ParseReply elem %d = %q, ParseCommand arg %q", i, r.Elems[i], args[i])
			}
		}
	})
}

func FuzzParseReply(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseReply(b)
		if err != nil {
			if errors.Is(err, ErrSyntax) == errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v must wrap exactly one of ErrSyntax, ErrTooLarge", err)
			}
			if r.Kind != 0 || r.Str != nil || r.Int != 0 || r.Elems != nil {
				t.Fatalf("non-zero Reply %+v with error %v", r, err)
			}
			return
		}
		if cap(r.Str) != len(r.Str) {
			t.Fatalf("Str capacity not clipped")
		}
		// Re-encoding canonically gives a reply that decodes the same.
		var enc []byte
		switch r.Kind {
		case KindSimple:
			enc = AppendSimple(nil, string(r.Str))
		case KindError:
			enc = AppendError(nil, string(r.Str))
		case KindInt:
			enc = AppendInt(nil, r.Int)
		case KindBulk:
			if r.Str == nil {
				t.Fatalf("bulk with nil Str")
			}
			enc = AppendBulk(nil, r.Str)
		case KindNull:
			enc = AppendNull(nil)
		case KindArray:
			if len(r.Elems) > MaxArgs {
				t.Fatalf("%d elements", len(r.Elems))
			}
			enc = AppendArrayHeader(nil, len(r.Elems))
			for _, e := range r.Elems {
				if e == nil {
					enc = AppendNull(enc)
				} else {
					enc = AppendBulk(enc, e)
				}
			}
		default:
			t.Fatalf("unknown kind %v", r.Kind)
		}
		r2, err := ParseReply(enc)
		if err != nil {
			t.Fatalf("re-encoded %q does not parse: %v", enc, err)
		}
		if r2.Kind != r.Kind || !bytes.Equal(r2.Str, r.Str) || r2.Int != r.Int || len(r2.Elems) != len(r.Elems) {
			t.Fatalf("round trip %q -> %+v -> %q -> %+v", b, r, enc, r2)
		}
		for i := range r.Elems {
			if (r.Elems[i] == nil) != (r2.Elems[i] == nil) || !bytes.Equal(r.Elems[i], r2.Elems[i]) {
				t.Fatalf("elem %d: %q vs %q", i, r.Elems[i], r2.Elems[i])
			}
		}
	})
}
