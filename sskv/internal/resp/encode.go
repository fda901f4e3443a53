package resp

import "strconv"

// crlf terminates every RESP line.
const crlf = "\r\n"

// AppendArrayHeader appends the header of an array of n elements, "*n\r\n",
// to dst and returns the extended slice. The caller appends the n elements
// itself. n should not be negative; a negative n is written as given.
func AppendArrayHeader(dst []byte, n int) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, crlf...)
}

// AppendBulk appends b as a bulk string, "$len\r\n" + b + "\r\n", to dst and
// returns the extended slice. b may hold any bytes, CR and LF included. A nil
// or empty b is written as the empty bulk string "$0\r\n\r\n", never as null;
// use [AppendNull] for null.
func AppendBulk(dst []byte, b []byte) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(b)), 10)
	dst = append(dst, crlf...)
	dst = append(dst, b...)
	return append(dst, crlf...)
}

// AppendBulkString is [AppendBulk] for a string, without converting it to a
// byte slice.
func AppendBulkString(dst []byte, s string) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	dst = append(dst, crlf...)
	dst = append(dst, s...)
	return append(dst, crlf...)
}

// AppendNull appends the null bulk string "$-1\r\n" (a GET miss) to dst and
// returns the extended slice.
func AppendNull(dst []byte) []byte {
	return append(dst, "$-1\r\n"...)
}

// AppendSimple appends the simple string "+s\r\n" to dst and returns the
// extended slice. A simple string cannot carry CR or LF, so each CR or LF in
// s is written as a space; the result is always one well-formed line.
func AppendSimple(dst []byte, s string) []byte {
	dst = append(dst, '+')
	dst = appendLine(dst, s)
	return append(dst, crlf...)
}

// AppendError appends the error reply "-ERR msg\r\n" to dst and returns the
// extended slice. msg is the bare message, such as "syntax error"; the "ERR "
// prefix is written here. An empty msg gives "-ERR\r\n". As in
// [AppendSimple], each CR or LF in msg is written as a space.
//
// [ParseReply] decodes the result to KindError with Str equal to msg (after
// that CR/LF replacement).
func AppendError(dst []byte, msg string) []byte {
	if msg == "" {
		return append(dst, "-ERR\r\n"...)
	}
	dst = append(dst, "-ERR "...)
	dst = appendLine(dst, msg)
	return append(dst, crlf...)
}

// AppendInt appends the integer reply ":n\r\n" to dst and returns the
// extended slice.
func AppendInt(dst []byte, n int64) []byte {
	dst = append(dst, ':')
	dst = strconv.AppendInt(dst, n, 10)
	return append(dst, crlf...)
}

// AppendCommand appends args as one array of bulk strings, the form of every
// request and notification, to dst and returns the extended slice:
//
//	AppendCommand(nil, []byte("GET"), []byte("k")) == "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
//
// It writes exactly [CommandLen](args...) bytes, and allocates nothing when
// dst has that much spare capacity. Calling it with no args writes "*0\r\n",
// which [ParseCommand] rejects.
func AppendCommand(dst []byte, args ...[]byte) []byte {
	dst = AppendArrayHeader(dst, len(args))
	for _, a := range args {
		dst = AppendBulk(dst, a)
	}
	return dst
}

// CommandLen returns the exact number of bytes [AppendCommand](dst, args...)
// appends, so that a buffer can be sized once:
//
//	buf := resp.AppendCommand(make([]byte, 0, resp.CommandLen(args...)), args...)
func CommandLen(args ...[]byte) int {
	n := 1 + decimalLen(len(args)) + 2 // *n\r\n
	for _, a := range args {
		n += 1 + decimalLen(len(a)) + 2 + len(a) + 2 // $len\r\n a \r\n
	}
	return n
}

// decimalLen returns the number of bytes strconv.AppendInt(nil, n, 10)
// writes: the digits of n, plus one for the sign of a negative n.
func decimalLen(n int) int {
	l := 1
	u := uint64(n)
	if n < 0 {
		l++
		u = -u
	}
	for u >= 10 {
		u /= 10
		l++
	}
	return l
}

// appendLine appends s with every CR and LF replaced by a space, so that it
// fits on one RESP line.
func appendLine(dst []byte, s string) []byte {
	start := len(dst)
	dst = append(dst, s...)
	line := dst[start:]
	for i, c := range line {
		if c == '\r' || c == '\n' {
			line[i] = ' '
		}
	}
	return dst
}
