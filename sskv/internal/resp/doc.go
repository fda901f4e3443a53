// Package resp encodes and decodes the RESP3 subset carried in the MQTT
// payloads of the Azure IoT Operations state store.
//
// It is the single codec shared by the dsslock client (package sskv) and the
// embedded state store (package sskv/localstore), so both sides agree byte for
// byte on what is valid.
//
// # What is on the wire
//
// Requests and KEYNOTIFY notifications are one RESP array of bulk strings:
//
//	*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n
//	*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n
//	*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n
//
// Bulk strings are binary safe: a value may contain CR, LF or any other byte.
//
// Responses are one reply each:
//
//	+OK\r\n            simple string            -> KindSimple
//	:1\r\n  :-1\r\n    integer                  -> KindInt
//	$4\r\n1234\r\n     bulk string              -> KindBulk
//	$0\r\n\r\n         empty bulk string        -> KindBulk, empty Str
//	$-1\r\n  _\r\n     null                     -> KindNull
//	-ERR msg\r\n       error                    -> KindError, Str "msg"
//
// # Strict and lenient decoding
//
// [ParseCommand] is strict: it is what the server applies to untrusted
// requests, and everything it accepts re-encodes with [AppendCommand] to the
// identical bytes (lengths must be canonical: no leading zeros, no "+", no
// "-0", and the payload must end with the final CRLF of the last element).
//
// [ParseReply] is lenient in the ways the public protocol document requires of
// a client, and in no others:
//
//   - the document's bare "-1\r\n" (not valid RESP) decodes as KindInt -1;
//   - "-ERR msg", "-ERR: msg" and "-ERR:msg" all decode to Str "msg";
//   - a reply's final CRLF may be missing at the very end of the payload
//     ("+OK", ":1", "-1", "-ERR msg", "$-1", and "$4\r\n1234" as the
//     document shows a GET hit);
//   - the RESP3 null "_\r\n" is accepted besides "$-1\r\n".
//
// Neither function accepts trailing bytes after a complete message.
//
// # Safety and cost
//
// Decoding never panics, whatever the input, and never allocates in
// proportion to a declared length: every declared length and count is checked
// against the bytes that remain (and against [MaxArgs]) first, and reported
// with [ErrTooLarge] if it does not fit. Malformed input is reported with an
// error that wraps [ErrSyntax] and names the offset and what was expected;
// test for either with errors.Is.
//
// Decoded byte slices alias the input (nothing is copied) and have their
// capacity clipped to their length, so appending to one never overwrites the
// input. They stay valid only as long as the caller keeps the input unchanged.
//
// The Append functions follow the strconv.Append convention: they append to
// dst and return the extended slice, and do not allocate when dst has
// enough capacity ([CommandLen] gives the exact size of a command).
// [ParseCommand] does not allocate when the args slice it is given has room
// for every element, and [ParseReply] allocates only for array replies.
//
// All functions are pure and safe for concurrent use.
package resp
