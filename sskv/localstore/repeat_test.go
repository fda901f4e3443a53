package localstore_test

import (
	"testing"

	"github.com/dsslock/dsslock/sskv/localstore"
)

// A copy of a SET, DEL or VDEL that a client's resumed session sends again
// (same client, same correlation data: the client never saw its PUBACK) is
// answered as the first one was and not executed again, on the same
// connection or the next. Before, a DEL repeated after another client took
// the key deleted that client's key. GET, other clients' requests with
// the same correlation data, and the client's other requests that reuse
// it, are executed as usual.
func TestRepeatedRequestAnsweredNotExecuted(t *testing.T) {
	srv := startStore(t, localstore.Config{})
	a := connect(t, srv, connOpts{id: "a"})
	b := connect(t, srv)
	// A copy is the same PUBLISH: the same correlation data and timestamp.
	setA := cmd("SET", "lock", "A").withoutTS().with("__ts", a.clock.Now().String())
	delA := cmd("DEL", "lock").withoutTS().with("__ts", a.clock.Now().String())
	setA.corr, delA.corr = []byte("set-a"), []byte("del-a")

	mustPayload(t, a.do(setA), okResp)
	first := a.do(delA)
	mustPayload(t, first, ":1\r\n")
	mustPayload(t, b.do(cmd("SET", "lock", "B", "NX")), okResp)

	again := a.do(delA)
	mustPayload(t, again, ":1\r\n")
	if again.props["__ts"] != first.props["__ts"] {
		t.Errorf("the repeat's version %q; want the first answer's %q", again.props["__ts"], first.props["__ts"])
	}
	mustPayload(t, a.do(setA), okResp)
	mustPayload(t, b.do(cmd("GET", "lock")), "$1\r\nB\r\n")

	// The next connection of the same client: its resumed session.
	a.close()
	a2 := connect(t, srv, connOpts{id: "a"})
	mustPayload(t, a2.do(delA), ":1\r\n")
	mustPayload(t, b.do(cmd("GET", "lock")), "$1\r\nB\r\n")

	// A GET is executed again; another client's correlation data is its own.
	get := cmd("GET", "lock")
	get.corr = []byte("get-a")
	mustPayload(t, a2.do(get), "$1\r\nB\r\n")
	mustPayload(t, b.do(cmd("SET", "lock", "C")), okResp)
	mustPayload(t, a2.do(get), "$1\r\nC\r\n")
	delB := cmd("DEL", "lock").withoutTS().with("__ts", delA.props["__ts"])
	delB.corr = delA.corr
	mustPayload(t, b.do(delB), ":1\r\n")
	mustPayload(t, b.do(cmd("GET", "lock")), nullResp)

	// A request of the same client that reuses correlation data is another
	// request: its payload or timestamp differs.
	mustPayload(t, a2.do(setA), okResp) // a copy: answered, not executed
	mustPayload(t, b.do(cmd("GET", "lock")), nullResp)
	setA2 := cmd("SET", "lock", "A2")
	setA2.corr = setA.corr
	mustPayload(t, a2.do(setA2), okResp)
	mustPayload(t, b.do(cmd("GET", "lock")), "$2\r\nA2\r\n")
	delA2 := cmd("DEL", "lock")
	delA2.corr = setA.corr
	mustPayload(t, a2.do(delA2), ":1\r\n")
	mustPayload(t, b.do(cmd("GET", "lock")), nullResp)
}
