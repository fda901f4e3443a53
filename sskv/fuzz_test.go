package sskv

import (
	"errors"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/sskv/internal/wire"
)

// FuzzParseResponse feeds arbitrary responses (payload, __stat, __ts) to the
// response decoder and to the interpretation of every verb: nothing may
// panic, and every error is either a *ServiceError or ErrMalformedResponse.
func FuzzParseResponse(f *testing.F) {
	ts := "000001700000000:00001:statestore"
	for _, p := range []string{"+OK\r\n", "+OK", ":-1\r\n", "-1\r\n", "-1", ":0\r\n", ":1\r\n", "$3\r\nabc\r\n",
		"$0\r\n\r\n", "$-1\r\n", "_\r\n", "-ERR syntax error\r\n", "-ERR: not authorized", "-ERR\r\n", "",
		"*2\r\n$1\r\na\r\n$-1\r\n", "$4\r\n1234", ":99999999999999999999\r\n", "\r\n"} {
		for v := range numVerbs {
			f.Add([]byte(p), "200", ts, true, true, uint8(v))
		}
	}
	f.Add([]byte("+OK\r\n"), "500", "", true, false, uint8(0))
	f.Add([]byte("+OK\r\n"), "", "1:2:3:4", false, true, uint8(1))
	f.Fuzz(func(t *testing.T, payload []byte, stat, ts string, hasStat, hasTS bool, v uint8) {
		var user paho.UserProperties
		if hasStat {
			user = append(user, paho.UserProperty{Key: wire.PropStatus, Value: stat})
		}
		if hasTS {
			user = append(user, paho.UserProperty{Key: wire.PropTimestamp, Value: ts})
		}
		r, err := decodeResponse(payload, user)
		if err != nil {
			var se *ServiceError
			if !errors.As(err, &se) && !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("decode error of unexpected kind: %v", err)
			}
			return
		}
		if !hasStat || stat != wire.StatusOK {
			t.Fatalf("accepted a response with __stat %q (present %v)", stat, hasStat)
		}
		if !r.version.IsZero() {
			if err := r.version.Validate(); err != nil {
				t.Fatalf("invalid version accepted: %v", err)
			}
		}
		if err := interpret(verb(v%uint8(numVerbs)), r); err != nil && !errors.Is(err, ErrMalformedResponse) {
			t.Fatalf("interpret error of unexpected kind: %v", err)
		}
	})
}

// FuzzParseNotification feeds arbitrary notifications to the parser and to
// the client's notification handling: nothing may panic, and what is
// accepted is a SET with a value or a DELETE, with a valid version.
func FuzzParseNotification(f *testing.F) {
	ts := "000001700000000:00001:statestore"
	for _, p := range []string{
		"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n",
		"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
		"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n",
		"*2\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n",
		"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n",
		"*4\r\n$6\r\nnotify\r\n$3\r\nset\r\n$5\r\nvalue\r\n$0\r\n\r\n",
		"", "+OK\r\n", "*1\r\n$6\r\nNOTIFY\r\n",
	} {
		f.Add([]byte(p), ts, true)
	}
	f.Add([]byte("*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"), "", false)
	f.Add([]byte("*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"), "x:y:z", true)
	cfg, _ := Config{ClientID: "fuzz"}.withDefaults(false)
	c, err := newClient(cfg)
	if err != nil {
		f.Fatal(err)
	}
	c.regs["k"] = &registration{key: "k"}
	f.Fuzz(func(t *testing.T, payload []byte, ts string, hasTS bool) {
		var user paho.UserProperties
		if hasTS {
			user = append(user, paho.UserProperty{Key: wire.PropTimestamp, Value: ts})
		}
		n, err := parseNotification(payload, user)
		if err == nil {
			switch {
			case n.op == OpSet && n.value == nil:
				t.Fatal("SET without value accepted")
			case n.op == OpDelete && n.value != nil:
				t.Fatal("DELETE with a value")
			case n.op != OpSet && n.op != OpDelete:
				t.Fatalf("op %v", n.op)
			}
			if err := n.version.Validate(); err != nil {
				t.Fatalf("invalid version accepted: %v", err)
			}
		}
		p := &paho.Publish{Topic: wire.NotifyTopic("fuzz", []byte("k")), Payload: payload,
			Properties: &paho.PublishProperties{User: user}}
		if ok, _ := c.HandlePublish(paho.PublishReceived{Packet: p}); !ok {
			t.Fatal("notification not taken")
		}
	})
}
