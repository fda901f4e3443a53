package hlc_test

import (
	"testing"

	"github.com/dsslock/dsslock/hlc"
)

const benchInput = "001696374425000:00001:StateStore"

var (
	sinkTS  hlc.Timestamp
	sinkStr string
)

func BenchmarkParse(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		t, err := hlc.Parse(benchInput)
		if err != nil {
			b.Fatal(err)
		}
		sinkTS = t
	}
}

func BenchmarkParseBytes(b *testing.B) {
	in := []byte(benchInput)
	b.ReportAllocs()
	for b.Loop() {
		t, err := hlc.ParseBytes(in)
		if err != nil {
			b.Fatal(err)
		}
		sinkTS = t
	}
}

func BenchmarkString(b *testing.B) {
	t := hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}
	b.ReportAllocs()
	for b.Loop() {
		sinkStr = t.String()
	}
}

func BenchmarkAppendText(b *testing.B) {
	t := hlc.Timestamp{Wall: 1696374425000, Counter: 1, Node: "StateStore"}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = t.AppendText(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkClockNow(b *testing.B) {
	c, err := hlc.NewClock("StateStore")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		sinkTS = c.Now()
	}
}

func BenchmarkClockUpdate(b *testing.B) {
	c, err := hlc.NewClock("StateStore")
	if err != nil {
		b.Fatal(err)
	}
	remote := hlc.Timestamp{Wall: c.Now().Wall, Counter: 3, Node: "Client1"}
	b.ReportAllocs()
	for b.Loop() {
		t, err := c.Update(remote)
		if err != nil {
			b.Fatal(err)
		}
		remote.Wall, remote.Counter = t.Wall, t.Counter // a client echoing the version back
	}
}

func BenchmarkClockNowParallel(b *testing.B) {
	c, err := hlc.NewClock("StateStore")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.Now()
		}
	})
}
