package hlc

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unique"
)

var (
	// ErrMalformed is returned, wrapped with a reason, for a string that is
	// not a valid timestamp and for a Timestamp or node id that breaks the
	// rules in the package documentation. Test for it with errors.Is.
	ErrMalformed = errors.New("hlc: malformed timestamp")

	// ErrDrift is returned, wrapped with how far ahead the timestamp is, when
	// a timestamp is more than the maximum drift ahead of the physical clock.
	// Test for it with errors.Is.
	ErrDrift = errors.New("hlc: timestamp too far ahead of the wall clock")

	// ErrOverflow is returned by Clock.Update when both the wall and the
	// counter are at their maximum, which only an absurd injected wall clock
	// reaches. A counter at MaxCounter alone moves the wall on instead.
	ErrOverflow = errors.New("hlc: counter overflow")
)

const (
	// MaxCounter is the largest valid counter, 2^31-1: the .NET SDK parses
	// the counter as a 32-bit signed integer.
	MaxCounter = math.MaxInt32

	// DefaultMaxDrift is how far ahead of the physical clock a Clock accepts
	// a timestamp by default. It matches the state store's limit.
	DefaultMaxDrift = 60 * time.Second
)

// Widths of the zero-padded numbers written by String.
const (
	wallWidth    = 15
	counterWidth = 5
)

// maxErrInput is how much of an offending input a parse error quotes.
const maxErrInput = 64

// Timestamp is a hybrid logical clock value. The zero Timestamp is not valid
// (it has no node id); it sorts before every valid Timestamp and reports
// IsZero.
//
// Timestamps are comparable values; two Timestamps are == exactly when
// Compare returns 0.
type Timestamp struct {
	Wall    int64  // milliseconds since the Unix epoch, >= 0
	Counter uint32 // logical counter, <= MaxCounter
	Node    string // node id: non-empty, no ':', no ASCII control characters
}

var (
	_ fmt.Stringer             = Timestamp{}
	_ encoding.TextAppender    = Timestamp{}
	_ encoding.TextMarshaler   = Timestamp{}
	_ encoding.TextUnmarshaler = (*Timestamp)(nil)
)

// Parse parses a timestamp in the wire format "{wall}:{counter}:{node}".
// Both numbers are unsigned decimal integers of any width (leading zeros are
// allowed, signs and whitespace are not); wall must fit in an int64 and
// counter must not exceed MaxCounter. The node id is everything after the
// second ':' and must be a valid node id (see the package documentation).
//
// On failure Parse returns the zero Timestamp and an error wrapping
// ErrMalformed that quotes (a prefix of) s.
func Parse(s string) (Timestamp, error) {
	return parse(s)
}

// ParseBytes is like Parse but takes a byte slice. It allocates only the
// node id string (and, on failure, the error).
func ParseBytes(b []byte) (Timestamp, error) {
	return parse(b)
}

func parse[S string | []byte](s S) (Timestamp, error) {
	if len(s) == 0 {
		return Timestamp{}, malformed("empty timestamp", s)
	}
	i := indexColon(s, 0)
	if i < 0 {
		return Timestamp{}, malformed("want 3 ':'-separated parts, got 1", s)
	}
	j := indexColon(s, i+1)
	if j < 0 {
		return Timestamp{}, malformed("want 3 ':'-separated parts, got 2", s)
	}
	wall, ok := parseWall(s[:i])
	if !ok {
		return Timestamp{}, malformed("wall is not a decimal int64", s)
	}
	counter, ok := parseCounter(s[i+1 : j])
	if !ok {
		return Timestamp{}, malformed("counter is not a decimal integer <= 2147483647", s)
	}
	node := s[j+1:]
	if reason := checkNode(node); reason != "" {
		return Timestamp{}, malformed(reason, s)
	}
	return Timestamp{Wall: wall, Counter: uint32(counter), Node: intern(node)}, nil
}

// intern returns node as a string shared by every timestamp parsed with
// the same node id. A state store hands out timestamps of one node, or a
// few; a node id cut from s would keep all of s alive for as long as the
// timestamp lives (a client keeps the versions and tokens of every key it
// holds or watches), and a copy per timestamp would cost as much.
func intern[S string | []byte](node S) string {
	return unique.Make(string(node)).Value()
}

func indexColon[S string | []byte](s S, from int) int {
	for k := from; k < len(s); k++ {
		if s[k] == ':' {
			return k
		}
	}
	return -1
}

// parseWall parses a non-empty run of decimal digits that fits in an int64.
func parseWall[S string | []byte](s S) (int64, bool) {
	if len(s) == 0 {
		return 0, false
	}
	var v int64
	for k := 0; k < len(s); k++ {
		d := s[k] - '0'
		if d > 9 {
			return 0, false
		}
		if v > (math.MaxInt64-int64(d))/10 {
			return 0, false
		}
		v = v*10 + int64(d)
	}
	return v, true
}

// parseCounter parses a non-empty run of decimal digits no greater than
// MaxCounter.
func parseCounter[S string | []byte](s S) (uint64, bool) {
	if len(s) == 0 {
		return 0, false
	}
	var v uint64
	for k := 0; k < len(s); k++ {
		d := s[k] - '0'
		if d > 9 {
			return 0, false
		}
		v = v*10 + uint64(d)
		if v > MaxCounter {
			return 0, false
		}
	}
	return v, true
}

// checkNode returns why node is not a valid node id, or "" if it is.
func checkNode[S string | []byte](node S) string {
	if len(node) == 0 {
		return "empty node id"
	}
	for k := 0; k < len(node); k++ {
		switch c := node[k]; {
		case c == ':':
			return "node id contains ':' (more than 3 parts)"
		case c < ' ' || c == 0x7f:
			return "node id contains a control character"
		}
	}
	return ""
}

// ValidateNode reports whether node is a valid node id: non-empty, with no
// ':' and no ASCII control characters. Spaces are allowed: official SDKs use
// the MQTT client id, which may contain them. The error wraps ErrMalformed.
func ValidateNode(node string) error {
	if reason := checkNode(node); reason != "" {
		return malformed(reason, node)
	}
	return nil
}

func malformed[S string | []byte](reason string, input S) error {
	in := string(input)
	if len(in) > maxErrInput {
		return fmt.Errorf("%w: %s: %q (truncated)", ErrMalformed, reason, in[:maxErrInput])
	}
	return fmt.Errorf("%w: %s: %q", ErrMalformed, reason, in)
}

// Validate reports whether t could have come from Parse: Wall is not
// negative, Counter is at most MaxCounter and Node is a valid node id. The
// error wraps ErrMalformed.
func (t Timestamp) Validate() error {
	switch {
	case t.Wall < 0:
		return fmt.Errorf("%w: negative wall %d", ErrMalformed, t.Wall)
	case t.Counter > MaxCounter:
		return fmt.Errorf("%w: counter %d exceeds %d", ErrMalformed, t.Counter, MaxCounter)
	}
	return ValidateNode(t.Node)
}

// String returns t in the wire format, zero-padded as "%015d:%05d:%s". It
// formats every Timestamp, valid or not; the zero Timestamp becomes
// "000000000000000:00000:", which Parse rejects. Use AppendText or MarshalText
// to refuse invalid values.
func (t Timestamp) String() string {
	var sb strings.Builder
	sb.Grow(t.textLen())
	var buf [32]byte // fits "-9223372036854775808:4294967295:"
	sb.Write(t.appendNumbers(buf[:0]))
	sb.WriteString(t.Node)
	return sb.String()
}

// AppendText implements encoding.TextAppender: it appends the String form of
// t to b. It returns b unchanged and an error wrapping ErrMalformed if t is
// not valid (see Validate). It does not allocate if b has room.
func (t Timestamp) AppendText(b []byte) ([]byte, error) {
	if err := t.Validate(); err != nil {
		return b, err
	}
	return t.appendTo(b), nil
}

// MarshalText implements encoding.TextMarshaler. Like AppendText, it fails
// for a Timestamp that is not valid, so that what it produces always parses.
func (t Timestamp) MarshalText() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t.appendTo(make([]byte, 0, t.textLen())), nil
}

// UnmarshalText implements encoding.TextUnmarshaler using ParseBytes. On
// failure t is left unchanged.
func (t *Timestamp) UnmarshalText(b []byte) error {
	u, err := ParseBytes(b)
	if err != nil {
		return err
	}
	*t = u
	return nil
}

// textLen returns the length of the String form of t.
func (t Timestamp) textLen() int {
	w := digits(uint64(t.Wall))
	if t.Wall < 0 {
		w = 1 + digits(negAbs(t.Wall))
	}
	return max(w, wallWidth) + 1 + max(digits(uint64(t.Counter)), counterWidth) + 1 + len(t.Node)
}

func (t Timestamp) appendTo(b []byte) []byte {
	return append(t.appendNumbers(b), t.Node...)
}

// appendNumbers appends "%015d:%05d:" formatted from t.Wall and t.Counter.
func (t Timestamp) appendNumbers(b []byte) []byte {
	if t.Wall < 0 {
		// As fmt does: the sign counts towards the width.
		b = append(b, '-')
		b = appendPadded(b, negAbs(t.Wall), wallWidth-1)
	} else {
		b = appendPadded(b, uint64(t.Wall), wallWidth)
	}
	b = append(b, ':')
	b = appendPadded(b, uint64(t.Counter), counterWidth)
	return append(b, ':')
}

// appendPadded appends v in decimal, left-padded with zeros to width (at most
// 20) digits.
func appendPadded(b []byte, v uint64, width int) []byte {
	var buf [20]byte
	i := len(buf)
	for v >= 10 {
		i--
		buf[i] = byte('0' + v%10)
		v /= 10
	}
	i--
	buf[i] = byte('0' + v)
	for len(buf)-i < width {
		i--
		buf[i] = '0'
	}
	return append(b, buf[i:]...)
}

// negAbs returns the magnitude of a negative v, without overflow for
// math.MinInt64.
func negAbs(v int64) uint64 { return uint64(-(v + 1)) + 1 }

func digits(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// Compare returns -1 if t is before u, +1 if t is after u and 0 if they are
// equal. Timestamps are ordered by Wall, then Counter, then Node compared
// byte-wise.
func (t Timestamp) Compare(u Timestamp) int {
	switch {
	case t.Wall < u.Wall:
		return -1
	case t.Wall > u.Wall:
		return +1
	case t.Counter < u.Counter:
		return -1
	case t.Counter > u.Counter:
		return +1
	}
	return strings.Compare(t.Node, u.Node)
}

// Before reports whether t is ordered before u.
func (t Timestamp) Before(u Timestamp) bool { return t.Compare(u) < 0 }

// After reports whether t is ordered after u.
func (t Timestamp) After(u Timestamp) bool { return t.Compare(u) > 0 }

// IsZero reports whether t is the zero Timestamp.
func (t Timestamp) IsZero() bool { return t.Wall == 0 && t.Counter == 0 && t.Node == "" }

// Time returns the physical part of t, time.UnixMilli(t.Wall), in the local
// time zone. The counter and node id are dropped.
func (t Timestamp) Time() time.Time { return time.UnixMilli(t.Wall) }
