package resp

import (
	"errors"
	"strconv"
)

// Errors reported by the decoders. Returned errors wrap one of them, with the
// offset into the input and what was expected; test with errors.Is.
var (
	// ErrSyntax reports input that is not the expected RESP: a wrong type
	// byte, a missing CRLF, a malformed or non-canonical number, a null where
	// none is allowed, or bytes after a complete message.
	ErrSyntax = errors.New("resp: syntax error")

	// ErrTooLarge reports a well-formed length or count that cannot be
	// honoured: an array of more than MaxArgs elements, or a declared bulk
	// length or element count that needs more bytes than the input has left.
	// It is reported before anything is allocated for it.
	ErrTooLarge = errors.New("resp: length exceeds limit")
)

// MaxArgs is the largest number of elements accepted in an array, by
// [ParseCommand] and by [ParseReply]. The longest request the state store
// knows, SET key value NEX PX ms, has 6.
const MaxArgs = 64

// Smallest encodings of one array element, used to reject an element count
// that cannot fit in the remaining input before allocating for it.
const (
	minBulkLen     = len("$0\r\n\r\n") // element of a command
	minReplyElemLn = len("$-1\r\n")    // element of an array reply (may be null)
)

// ParseCommand decodes b, which must be exactly one array of 1 to [MaxArgs]
// bulk strings: a request (server side) or a KEYNOTIFY notification (client
// side). It appends the elements to args[:0] and returns the result; each
// element is a sub-slice of b (nothing is copied) with its capacity clipped
// to its length.
//
// ParseCommand allocates nothing when cap(args) is at least the element
// count; otherwise it allocates one slice of exactly that size. Reuse the
// returned slice for the next call.
//
// It is strict, and whatever it accepts [AppendCommand] re-encodes to exactly
// b. Violations are reported as follows:
//
//   - not an array, a null or empty array, a non-bulk or null element, a
//     malformed or non-canonical length (leading zero, sign, "-0"), a
//     missing CRLF, or any byte after the last element: an error wrapping
//     [ErrSyntax];
//   - more than MaxArgs elements, or a count or bulk length that needs more
//     bytes than b has left: an error wrapping [ErrTooLarge].
//
// On error it returns args[:0] (possibly with a larger capacity), never nil
// elements.
func ParseCommand(b []byte, args [][]byte) ([][]byte, error) {
	args = args[:0]
	if len(b) == 0 {
		return args, syntaxErr(0, "expected '*', got empty payload")
	}
	if b[0] != '*' {
		return args, syntaxErr(0, "expected '*' (array of bulk strings)")
	}
	out, _, next, err := parseArray(b, 1, args, true)
	if err != nil {
		return out[:0], err
	}
	if next != len(b) {
		return out[:0], syntaxErr(next, "expected end of payload after array")
	}
	return out, nil
}

// Kind identifies the type of a decoded [Reply].
type Kind uint8

// The kinds of reply [ParseReply] produces. The zero Kind is not one of them.
const (
	// KindSimple is a simple string such as "+OK"; Str holds the text
	// after '+'.
	KindSimple Kind = iota + 1
	// KindError is an error such as "-ERR syntax error". Str holds the
	// message with the "ERR " / "ERR: " / "ERR:" prefix (or a bare "ERR")
	// removed, or the whole text after '-' when there is no such prefix.
	KindError
	// KindInt is an integer such as ":1" or ":-1", and also the protocol
	// document's bare "-1" (decoded as Int -1). Int holds the value.
	KindInt
	// KindBulk is a bulk string such as "$4\r\n1234\r\n"; Str holds the
	// payload, which may be empty and may contain any bytes.
	KindBulk
	// KindNull is the null bulk string "$-1", the RESP3 null "_", or the
	// null array "*-1".
	KindNull
	// KindArray is an array of bulk strings; Elems holds them, with a nil
	// element for a null bulk string.
	KindArray
)

// String returns the lower-case name of k ("simple", "error", "int", "bulk",
// "null", "array"), or "Kind(n)" for a value that is not one of the kinds.
func (k Kind) String() string {
	switch k {
	case KindSimple:
		return "simple"
	case KindError:
		return "error"
	case KindInt:
		return "int"
	case KindBulk:
		return "bulk"
	case KindNull:
		return "null"
	case KindArray:
		return "array"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Reply is one decoded response. Which fields are set depends on Kind; the
// others are zero. Byte slices alias the input given to [ParseReply] and
// have their capacity clipped to their length.
type Reply struct {
	Kind Kind
	// Str is the text of a KindSimple or KindError reply, or the payload of
	// a KindBulk reply (non-nil, possibly empty). Nil for other kinds.
	Str []byte
	// Int is the value of a KindInt reply.
	Int int64
	// Elems are the elements of a KindArray reply, nil for a null element.
	// It has length 0 for an empty array.
	Elems [][]byte
}

// ParseReply decodes b, which must be exactly one reply, as sent in response
// to a request. It allocates only for a KindArray reply (one slice for
// Elems).
//
// It accepts the RESP forms the state store sends, plus the forms the public
// protocol document shows (see the package documentation): a bare "-1" is
// KindInt -1, "-ERR: msg" is KindError "msg", and the final CRLF may be
// missing at the end of the payload, except inside an array.
//
// Errors wrap [ErrSyntax] for malformed input, an unsupported type byte, or
// bytes after a complete reply, and [ErrTooLarge] for a bulk length or array
// count beyond the remaining input or an array longer than [MaxArgs].
// Integers must be an optional '-' followed by decimal digits, within int64.
func ParseReply(b []byte) (Reply, error) {
	if len(b) == 0 {
		return Reply{}, syntaxErr(0, "expected a reply, got empty payload")
	}
	switch b[0] {
	case '+':
		line, err := replyLine(b, 1)
		if err != nil {
			return Reply{}, err
		}
		return Reply{Kind: KindSimple, Str: line}, nil

	case '-':
		line, err := replyLine(b, 1)
		if err != nil {
			return Reply{}, err
		}
		if len(line) == 1 && line[0] == '1' {
			// The protocol document's "not applied" form; not valid RESP.
			return Reply{Kind: KindInt, Int: -1}, nil
		}
		return Reply{Kind: KindError, Str: trimErrPrefix(line)}, nil

	case ':':
		line, err := replyLine(b, 1)
		if err != nil {
			return Reply{}, err
		}
		n, ok := parseInt(line)
		if !ok {
			return Reply{}, syntaxErr(1, "expected an integer (optional '-' then digits, within int64)")
		}
		return Reply{Kind: KindInt, Int: n}, nil

	case '_':
		line, err := replyLine(b, 1)
		if err != nil {
			return Reply{}, err
		}
		if len(line) != 0 {
			return Reply{}, syntaxErr(1, "expected CRLF after '_'")
		}
		return Reply{Kind: KindNull}, nil

	case '$':
		v, next, err := readBulk(b, 0, true, true)
		if err != nil {
			return Reply{}, err
		}
		if next != len(b) {
			return Reply{}, syntaxErr(next, "expected end of payload after bulk string")
		}
		if v == nil {
			return Reply{Kind: KindNull}, nil
		}
		return Reply{Kind: KindBulk, Str: v}, nil

	case '*':
		elems, n, next, err := parseArray(b, 1, nil, false)
		if err != nil {
			return Reply{}, err
		}
		if next != len(b) {
			return Reply{}, syntaxErr(next, "expected end of payload after array")
		}
		if n < 0 {
			return Reply{Kind: KindNull}, nil
		}
		return Reply{Kind: KindArray, Elems: elems}, nil
	}
	return Reply{}, syntaxErr(0, "expected one of '+', '-', ':', '$', '_', '*'")
}

// parseArray decodes the count line that starts at b[i] (just after '*')
// and the bulk strings that follow it, appending them to dst. It returns the
// extended dst, the declared count (-1 for a null array) and the offset just
// past the array.
//
// For a command (strict) the count must be 1..MaxArgs and elements must not
// be null. For a reply a count of 0 is allowed, "*-1" is a null array (and
// may lack its CRLF at the very end), and null elements are appended as nil.
func parseArray(b []byte, i int, dst [][]byte, command bool) ([][]byte, int, int, error) {
	n, next, err := readLength(b, i, !command, !command, MaxArgs, "array count exceeds MaxArgs")
	if err != nil {
		return dst, 0, 0, err
	}
	if n < 0 {
		return dst, n, next, nil // null array, replies only
	}
	if n == 0 && command {
		return dst, 0, 0, syntaxErr(i, "expected at least one array element")
	}
	minElem := minBulkLen
	if !command {
		minElem = minReplyElemLn
	}
	if n > (len(b)-next)/minElem {
		return dst, 0, 0, tooLargeErr(i, "array count exceeds the remaining input")
	}
	if cap(dst)-len(dst) < n {
		grown := make([][]byte, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	for k := 0; k < n; k++ {
		var v []byte
		v, next, err = readBulk(b, next, !command, false)
		if err != nil {
			return dst, 0, 0, err
		}
		dst = append(dst, v)
	}
	return dst, n, next, nil
}

// readBulk decodes the bulk string that starts with '$' at b[i] and returns
// its payload (nil for a null bulk string) and the offset just past it.
// nullOK allows "$-1"; atEnd allows the final CRLF (after the length of a
// null, or after the payload) to be missing when the payload ends there.
// A non-null payload is returned non-nil, even when empty.
func readBulk(b []byte, i int, nullOK, atEnd bool) ([]byte, int, error) {
	if i >= len(b) {
		return nil, 0, syntaxErr(i, "expected '$', got end of payload")
	}
	if b[i] != '$' {
		return nil, 0, syntaxErr(i, "expected '$' (bulk string)")
	}
	n, next, err := readLength(b, i+1, nullOK, atEnd, len(b), "bulk length exceeds the remaining input")
	if err != nil {
		return nil, 0, err
	}
	if n < 0 {
		return nil, next, nil
	}
	if n > len(b)-next {
		return nil, 0, tooLargeErr(i+1, "bulk length exceeds the remaining input")
	}
	end := next + n
	v := b[next:end:end]
	if atEnd && end == len(b) {
		return v, end, nil
	}
	if err := expectCRLF(b, end); err != nil {
		return nil, 0, err
	}
	return v, end + 2, nil
}

// readLength decodes the length or count that starts at b[i] and ends with
// CRLF, returning it and the offset just past the CRLF. The digits must be
// canonical (no sign, no leading zero). "-1" is accepted, as -1, only when
// nullOK, and then atEnd lets it end the payload without CRLF. A well-formed
// value above limit is reported as ErrTooLarge, described by tooLarge;
// arithmetic saturates, so no length overflows.
func readLength(b []byte, i int, nullOK, atEnd bool, limit int, tooLarge string) (int, int, error) {
	if i < len(b) && b[i] == '-' {
		if !nullOK {
			return 0, 0, syntaxErr(i, "expected a non-negative length")
		}
		if i+1 >= len(b) || b[i+1] != '1' {
			return 0, 0, syntaxErr(i, "expected -1 or a non-negative length")
		}
		j := i + 2
		if atEnd && j == len(b) {
			return -1, j, nil
		}
		if err := expectCRLF(b, j); err != nil {
			return 0, 0, err
		}
		return -1, j + 2, nil
	}
	j := i
	var v uint64
	over := false
	for j < len(b) && isDigit(b[j]) {
		if !over {
			v = v*10 + uint64(b[j]-'0')
			over = v > uint64(limit)
		}
		j++
	}
	switch {
	case j == i:
		return 0, 0, syntaxErr(i, "expected a decimal length")
	case b[i] == '0' && j-i > 1:
		return 0, 0, syntaxErr(i, "expected a length without leading zeros")
	}
	if err := expectCRLF(b, j); err != nil {
		return 0, 0, err
	}
	if over {
		return 0, 0, tooLargeErr(i, tooLarge)
	}
	return int(v), j + 2, nil
}

// replyLine returns the text of the line that starts at b[i] and must end
// the payload: either followed by a CRLF that is the last thing in b, or, as
// the document's examples show, running to the end of b with no CR or LF.
// A lone CR or LF is a syntax error. The result has its capacity clipped.
func replyLine(b []byte, i int) ([]byte, error) {
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '\r':
			if j+1 >= len(b) || b[j+1] != '\n' {
				return nil, syntaxErr(j, "expected LF after CR")
			}
			if j+2 != len(b) {
				return nil, syntaxErr(j+2, "expected end of payload after reply")
			}
			return b[i:j:j], nil
		case '\n':
			return nil, syntaxErr(j, "expected CR before LF")
		}
	}
	return b[i:len(b):len(b)], nil
}

// trimErrPrefix removes the "ERR" code and the ": ", ":" or " " after it
// from an error line. A line without that code is returned as it is.
func trimErrPrefix(line []byte) []byte {
	if len(line) < 3 || line[0] != 'E' || line[1] != 'R' || line[2] != 'R' {
		return line
	}
	rest := line[3:]
	switch {
	case len(rest) == 0:
		return rest
	case rest[0] == ' ':
		return rest[1:]
	case rest[0] == ':':
		if len(rest) > 1 && rest[1] == ' ' {
			return rest[2:]
		}
		return rest[1:]
	}
	return line // e.g. "ERRX": not the ERR code
}

// parseInt decodes an optional '-' followed by one or more decimal digits,
// reporting false for anything else and for a value outside int64.
func parseInt(s []byte) (int64, bool) {
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg = true
		s = s[1:]
	}
	if len(s) == 0 {
		return 0, false
	}
	limit := uint64(1<<63 - 1)
	if neg {
		limit = 1 << 63
	}
	var m uint64
	for _, c := range s {
		if !isDigit(c) {
			return 0, false
		}
		d := uint64(c - '0')
		if m > (limit-d)/10 {
			return 0, false
		}
		m = m*10 + d
	}
	if neg {
		return int64(-m), true // -(1<<63) wraps to math.MinInt64, as intended
	}
	return int64(m), true
}

// expectCRLF reports a syntax error unless b[i:] starts with CRLF.
func expectCRLF(b []byte, i int) error {
	if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
		return nil
	}
	return syntaxErr(i, "expected CRLF")
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseError is the detailed error the decoders return. It wraps ErrSyntax
// or ErrTooLarge.
type parseError struct {
	kind   error
	offset int
	what   string
}

func (e *parseError) Error() string {
	return e.kind.Error() + ": " + e.what + " at offset " + strconv.Itoa(e.offset)
}

func (e *parseError) Unwrap() error { return e.kind }

func syntaxErr(offset int, what string) error {
	return &parseError{kind: ErrSyntax, offset: offset, what: what}
}

func tooLargeErr(offset int, what string) error {
	return &parseError{kind: ErrTooLarge, offset: offset, what: what}
}
