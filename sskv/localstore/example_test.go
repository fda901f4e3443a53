package localstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/rawmqtt"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/internal/resp"
	"github.com/dsslock/dsslock/sskv/internal/wire"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// Start a local state store on a free port and talk to it with a plain MQTT
// v5 client: a SET stamped with the client's clock, then a GET.
func ExampleStart() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	ctx := context.Background()
	c, err := rawmqtt.Dial(ctx, srv.Addr(), "example-client")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	clock, _ := hlc.NewClock("example-client")

	set := resp.AppendCommand(nil, []byte("SET"), []byte("greeting"), []byte("hello"))
	r, err := c.Request(ctx, wire.InvokeTopic, set, paho.UserProperties{{Key: "__ts", Value: clock.Now().String()}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("SET: %q\n", r.Payload)

	get := resp.AppendCommand(nil, []byte("GET"), []byte("greeting"))
	r, err = c.Request(ctx, wire.InvokeTopic, get, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("GET: %q\n", r.Payload)
	// Output:
	// SET: "+OK\r\n"
	// GET: "$5\r\nhello\r\n"
}

// A test of what a client does when the store applies its write but the
// answer is lost: the client's request times out, and the write is there.
func ExampleServer_SetResponseFault() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "worker"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	srv.SetResponseFault("worker", localstore.ResponseFault{Drop: true})
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.Set(short, "job", []byte("done"), sskv.SetOptions{})
	cancelShort()
	fmt.Println("SET timed out:", errors.Is(err, context.DeadlineExceeded))

	srv.SetResponseFault("worker", localstore.ResponseFault{}) // answers again
	res, err := c.Get(ctx, "job")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("GET: %s\n", res.Value)
	// Output:
	// SET timed out: true
	// GET: done
}

// Test what a service does across a restart of the broker and its state
// store: keys persisted (here every key, PersistAll) come back with their
// version, others would be lost; clients reconnect by themselves.
func ExampleServer_Restart() {
	dir, err := os.MkdirTemp("", "statestore-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := localstore.Start(localstore.Config{Persist: localstore.PersistAll, DataDir: dir})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), ClientID: "example-restart"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	before, err := c.Set(ctx, "config", []byte("v1"), sskv.SetOptions{})
	if err != nil {
		log.Fatal(err)
	}

	// A crash, 100 ms down, and a restart on the same address.
	srv, err = srv.Restart(ctx, 100*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	after, err := c.Get(ctx, "config") // the client reconnects on its own
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(after.Value), after.Version == before.Version)
	// Output: v1 true
}
