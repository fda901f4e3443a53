package sskv

import (
	"fmt"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// verb is the command a response answers; it decides which replies are valid.
type verb uint8

const (
	verbGet verb = iota
	verbSet
	verbDel
	verbVDel
	verbKeyNotify
	verbKeyNotifyStop
	verbRaw // a raw request (a test's, or the client's own probe): any reply is accepted
	numVerbs
)

var verbNames = [numVerbs]string{"GET", "SET", "DEL", "VDEL", "KEYNOTIFY", "KEYNOTIFY STOP", "raw"}

func (v verb) String() string {
	if v < numVerbs {
		return verbNames[v]
	}
	return fmt.Sprintf("verb(%d)", uint8(v))
}

// propStatusMessage is the status message the RPC convention sends with a
// non-200 __stat.
const propStatusMessage = "__stMsg"

// reply is a decoded response: the RESP reply and the version from __ts
// (zero when the response has none).
type reply struct {
	resp.Reply
	version hlc.Timestamp
	seq     uint64 // see result.seq
}

// decodeResponse decodes a response's payload and user properties, checking
// what every response must have. An -ERR reply becomes a *ServiceError, a
// response that cannot be understood an error wrapping ErrMalformedResponse.
// It never panics, whatever the input.
func decodeResponse(payload []byte, user paho.UserProperties) (reply, error) {
	var stat, ts, stMsg string
	var hasStat, hasTS bool
	for _, p := range user {
		switch p.Key {
		case wire.PropStatus:
			stat, hasStat = p.Value, true
		case wire.PropTimestamp:
			ts, hasTS = p.Value, true
		case propStatusMessage:
			stMsg = p.Value
		}
	}
	if !hasStat {
		return reply{}, fmt.Errorf("%w: no %s property", ErrMalformedResponse, wire.PropStatus)
	}
	if stat != wire.StatusOK {
		msg := "status " + stat
		if stMsg != "" {
			msg += ": " + stMsg
		}
		return reply{}, &ServiceError{Message: msg}
	}
	r, err := resp.ParseReply(payload)
	if err != nil {
		return reply{}, fmt.Errorf("%w: %w", ErrMalformedResponse, err)
	}
	if r.Kind == resp.KindError {
		return reply{}, &ServiceError{Message: string(r.Str)}
	}
	out := reply{Reply: r}
	if hasTS {
		if out.version, err = hlc.Parse(ts); err != nil {
			return reply{}, fmt.Errorf("%w: %s: %w", ErrMalformedResponse, wire.PropTimestamp, err)
		}
	}
	return out, nil
}

func unexpected(v verb, r reply) error {
	return fmt.Errorf("%w: unexpected %s reply to %s", ErrMalformedResponse, r.Kind, v)
}

func getResult(r reply) (GetResult, error) {
	switch r.Kind {
	case resp.KindBulk:
		return GetResult{Value: r.Str, Version: r.version, Found: true}, nil
	case resp.KindNull:
		return GetResult{}, nil
	}
	return GetResult{}, unexpected(verbGet, r)
}

func setResult(r reply) (SetResult, error) {
	switch {
	case r.Kind == resp.KindSimple && string(r.Str) == "OK":
		if r.version.IsZero() {
			return SetResult{}, fmt.Errorf("%w: applied SET without %s", ErrMalformedResponse, wire.PropTimestamp)
		}
		return SetResult{Applied: true, Version: r.version}, nil
	case r.Kind == resp.KindInt && r.Int == -1:
		return SetResult{Version: r.version}, nil
	}
	return SetResult{}, unexpected(verbSet, r)
}

func delResult(v verb, r reply) (DelResult, error) {
	if r.Kind == resp.KindInt {
		switch {
		case r.Int == 1:
			return DelResult{Deleted: true, Version: r.version}, nil
		case r.Int == 0:
			return DelResult{Version: r.version}, nil
		case r.Int == -1 && v == verbVDel:
			return DelResult{Mismatch: true, Version: r.version}, nil
		}
	}
	return DelResult{}, unexpected(v, r)
}

func keyNotifyResult(v verb, r reply) error {
	switch {
	case r.Kind == resp.KindSimple && string(r.Str) == "OK":
		return nil
	case v == verbKeyNotifyStop && r.Kind == resp.KindInt && (r.Int == 0 || r.Int == 1):
		return nil
	}
	return unexpected(v, r)
}

// interpret checks that r is a valid reply to v. It exists for the fuzz
// target, which feeds every verb.
func interpret(v verb, r reply) error {
	var err error
	switch v {
	case verbGet:
		_, err = getResult(r)
	case verbSet:
		_, err = setResult(r)
	case verbDel, verbVDel:
		_, err = delResult(v, r)
	case verbKeyNotify, verbKeyNotifyStop:
		err = keyNotifyResult(v, r)
	}
	return err
}
