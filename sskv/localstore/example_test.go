package localstore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/eclipse/paho.golang/paho"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/internal/rawmqtt"
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
