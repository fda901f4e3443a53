package sskv

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// The outcome of each kind of answer and error, as the client gets them:
// replies decoded from the store's payloads, and errors wrapped as the
// client wraps them. Contention (a condition not met, another holder's
// fence) is "refused", never "service_error".
func TestOutcomeClassification(t *testing.T) {
	decoded := func(payload string) reply {
		t.Helper()
		r, err := decodeResponse([]byte(payload), paho.UserProperties{
			{Key: wire.PropStatus, Value: wire.StatusOK},
			{Key: wire.PropTimestamp, Value: "1700000000000:00000:store"},
		})
		if err != nil {
			t.Fatalf("decode %q: %v", payload, err)
		}
		return r
	}
	serviceError := func(payload string) error {
		t.Helper()
		_, err := decodeResponse([]byte(payload), paho.UserProperties{{Key: wire.PropStatus, Value: wire.StatusOK}})
		var se *ServiceError
		if !errors.As(err, &se) {
			t.Fatalf("decode %q: %v; want a *ServiceError", payload, err)
		}
		return keyErr("SET", "k", err)
	}
	for _, c := range []struct {
		name string
		v    verb
		r    reply
		err  error
		want string
	}{
		{"SET applied", verbSet, decoded("+OK\r\n"), nil, OutcomeOK},
		{"SET condition not met", verbSet, decoded(":-1\r\n"), nil, OutcomeRefused},
		{"SET condition not met, document's form", verbSet, decoded("-1"), nil, OutcomeRefused},
		{"GET hit", verbGet, decoded("$1\r\nv\r\n"), nil, OutcomeOK},
		{"GET miss", verbGet, decoded("$-1\r\n"), nil, OutcomeOK},
		{"DEL deleted", verbDel, decoded(":1\r\n"), nil, OutcomeOK},
		{"DEL of a missing key", verbDel, decoded(":0\r\n"), nil, OutcomeOK},
		{"VDEL deleted", verbVDel, decoded(":1\r\n"), nil, OutcomeOK},
		{"VDEL of a missing key", verbVDel, decoded(":0\r\n"), nil, OutcomeOK},
		{"VDEL of another value", verbVDel, decoded(":-1\r\n"), nil, OutcomeRefused},
		{"KEYNOTIFY STOP not watching", verbKeyNotifyStop, decoded(":0\r\n"), nil, OutcomeOK},

		{"fencing token required", verbSet, reply{}, serviceError("-ERR " + wire.MsgFencingRequired + "\r\n"), OutcomeRefused},
		{"fencing token lower", verbVDel, reply{}, serviceError("-ERR " + wire.MsgFencingLower + "\r\n"), OutcomeRefused},
		{"fencing token lower, document's typo and form", verbDel, reply{}, serviceError("-ERR: " + wire.MsgFencingLowerDoc + "\r\n"), OutcomeRefused},
		{"fencing token skew", verbSet, reply{}, serviceError("-ERR " + wire.MsgFencingSkew + "\r\n"), OutcomeServiceError},
		{"timestamp skew", verbSet, reply{}, serviceError("-ERR " + wire.MsgTimestampSkew + "\r\n"), OutcomeServiceError},
		{"not authorized", verbGet, reply{}, serviceError("-ERR " + wire.MsgNotAuthorized + "\r\n"), OutcomeServiceError},
		{"quota", verbSet, reply{}, serviceError("-ERR " + wire.MsgQuotaExceeded + "\r\n"), OutcomeServiceError},
		{"unknown message", verbSet, reply{}, serviceError("-ERR the fencing token is required\r\n"), OutcomeServiceError},
		{"status not 200", verbSet, reply{}, &ServiceError{Message: "status 503: busy"}, OutcomeServiceError},

		{"deadline", verbSet, reply{}, fmt.Errorf("%w (the connection was lost while the request was in flight; its outcome is unknown)", context.DeadlineExceeded), OutcomeTimeout},
		{"cancelled", verbSet, reply{}, fmt.Errorf("%w (not connected; the request was not sent)", context.Canceled), OutcomeCanceled},
		{"connection lost", verbVDel, reply{}, keyErr("VDEL", "k", ErrConnectionLost), OutcomeConnectionLost},
		{"not sent", verbSet, reply{}, keyErr("SET", "k", ErrNotSent), OutcomeNotSent},
		{"too large", verbSet, reply{}, fmt.Errorf("%w: 5 MiB", ErrTooLarge), OutcomeTooLarge},
		{"closed", verbGet, reply{}, ErrClosed, OutcomeClosed},
		{"malformed", verbSet, reply{}, fmt.Errorf("%w: no __stat property", ErrMalformedResponse), OutcomeError},
		{"rejected PUBLISH", verbSet, reply{}, ErrPublishRejected, OutcomeError},
	} {
		if got := outcome(c.v, c.r, c.err); got != c.want {
			t.Errorf("%s: outcome(%s, %v) = %q; want %q", c.name, c.v, c.err, got, c.want)
		}
	}
}
