package resp

import (
	"bytes"
	"testing"
)

var (
	benchKey   = bytes.Repeat([]byte("k"), 16)
	benchValue = bytes.Repeat([]byte("v"), 64)
	benchSet   = [][]byte{[]byte("SET"), benchKey, benchValue}

	sinkBytes []byte
	sinkArgs  [][]byte
	sinkReply Reply
)

func BenchmarkAppendCommand(b *testing.B) {
	buf := make([]byte, 0, CommandLen(benchSet...))
	b.ReportAllocs()
	b.SetBytes(int64(cap(buf)))
	for b.Loop() {
		buf = AppendCommand(buf[:0], benchSet...)
	}
	sinkBytes = buf
}

func BenchmarkParseCommand(b *testing.B) {
	payload := AppendCommand(nil, benchSet...)
	args := make([][]byte, 0, 8)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		var err error
		args, err = ParseCommand(payload, args)
		if err != nil {
			b.Fatal(err)
		}
	}
	sinkArgs = args
}

func BenchmarkParseReply(b *testing.B) {
	cases := []struct {
		name    string
		payload []byte
	}{
		{"OK", []byte("+OK\r\n")},
		{"Bulk64", AppendBulk(nil, benchValue)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.payload)))
			for b.Loop() {
				r, err := ParseReply(c.payload)
				if err != nil {
					b.Fatal(err)
				}
				sinkReply = r
			}
		})
	}
}
