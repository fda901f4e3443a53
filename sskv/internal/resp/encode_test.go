package resp

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestAppendFunctions(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"array header", AppendArrayHeader(nil, 3), "*3\r\n"},
		{"array header zero", AppendArrayHeader(nil, 0), "*0\r\n"},
		{"bulk", AppendBulk(nil, []byte("1234")), "$4\r\n1234\r\n"},
		{"bulk empty", AppendBulk(nil, []byte{}), "$0\r\n\r\n"},
		{"bulk nil is empty, not null", AppendBulk(nil, nil), "$0\r\n\r\n"},
		{"bulk binary with CRLF", AppendBulk(nil, []byte("a\r\nb\x00")), "$5\r\na\r\nb\x00\r\n"},
		{"bulk string", AppendBulkString(nil, "SET"), "$3\r\nSET\r\n"},
		{"bulk string empty", AppendBulkString(nil, ""), "$0\r\n\r\n"},
		{"null", AppendNull(nil), "$-1\r\n"},
		{"simple", AppendSimple(nil, "OK"), "+OK\r\n"},
		{"simple empty", AppendSimple(nil, ""), "+\r\n"},
		{"simple sanitises CR LF", AppendSimple(nil, "a\r\nb\nc\r"), "+a  b c \r\n"},
		{"error", AppendError(nil, "syntax error"), "-ERR syntax error\r\n"},
		{"error empty", AppendError(nil, ""), "-ERR\r\n"},
		{"error sanitises CR LF", AppendError(nil, "x\r\ny"), "-ERR x  y\r\n"},
		{"int 1", AppendInt(nil, 1), ":1\r\n"},
		{"int 0", AppendInt(nil, 0), ":0\r\n"},
		{"int -1", AppendInt(nil, -1), ":-1\r\n"},
		{"int min", AppendInt(nil, math.MinInt64), ":-9223372036854775808\r\n"},
		{"int max", AppendInt(nil, math.MaxInt64), ":9223372036854775807\r\n"},
		{"appends to dst", AppendInt([]byte("+OK\r\n"), 7), "+OK\r\n:7\r\n"},
		{"command SET", AppendCommand(nil, []byte("SET"), []byte("k"), []byte("v")),
			"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"},
		{"command NOTIFY SET", AppendCommand(nil, []byte("NOTIFY"), []byte("SET"), []byte("VALUE"), []byte("abc")),
			"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"},
		{"command NOTIFY DELETE", AppendCommand(nil, []byte("NOTIFY"), []byte("DELETE")),
			"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"},
		{"command binary and empty", AppendCommand(nil, []byte("SET"), []byte("\r\n"), nil),
			"*3\r\n$3\r\nSET\r\n$2\r\n\r\n\r\n$0\r\n\r\n"},
		{"command no args", AppendCommand(nil), "*0\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if string(tt.got) != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestCommandLen(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 12345)
	tests := [][][]byte{
		nil,
		{[]byte("GET")},
		{[]byte("GET"), []byte("k")},
		{[]byte("SET"), []byte("key"), []byte(""), []byte("NEX"), []byte("PX"), []byte("30000")},
		{[]byte("SET"), big, big[:9], big[:10], big[:99], big[:100], big[:1000]},
		make([][]byte, 10),
		make([][]byte, 100),
	}
	for _, args := range tests {
		enc := AppendCommand(nil, args...)
		if got := CommandLen(args...); got != len(enc) {
			t.Errorf("CommandLen(%d args) = %d, encoded length %d", len(args), got, len(enc))
		}
	}
}

func TestDecimalLen(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 99, 100, -1, -9, -10, math.MaxInt, math.MinInt} {
		want := len(AppendArrayHeader(nil, n)) - 3
		if got := decimalLen(n); got != want {
			t.Errorf("decimalLen(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestAppendZeroAllocs(t *testing.T) {
	key := []byte(strings.Repeat("k", 16))
	val := []byte(strings.Repeat("v", 64))
	args := [][]byte{[]byte("SET"), key, val, []byte("NEX"), []byte("PX"), []byte("30000")}
	buf := make([]byte, 0, 512)
	allocs := testing.AllocsPerRun(100, func() {
		buf = AppendCommand(buf[:0], args...)
		buf = AppendSimple(buf, "OK")
		buf = AppendError(buf, "syntax error")
		buf = AppendInt(buf, -1)
		buf = AppendNull(buf)
		buf = AppendBulkString(buf, "x")
		_ = CommandLen(args...)
	})
	if allocs != 0 {
		t.Errorf("got %v allocs per run, want 0", allocs)
	}
}
