package interop

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/Azure/iot-operations-sdks/go/mqtt"
	"github.com/Azure/iot-operations-sdks/go/protocol"
)

// TestGuideSettings connects the official Go SDK the way docs/sdk-guide.md
// tells a user to: mqtt.NewSessionClientFromEnv with exactly the AIO_*
// variables the guide sets, and no others.
func TestGuideSettings(t *testing.T) {
	e := newEnv(t)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "AIO_") {
			t.Setenv(name, "") // restored after the test
			os.Unsetenv(name)
		}
	}
	host := storeHost
	if host == "127.0.0.1" {
		host = "localhost" // as the guide writes it
	}
	id := "guide-" + randHex(4)
	t.Setenv("AIO_BROKER_HOSTNAME", host)
	t.Setenv("AIO_BROKER_TCP_PORT", strconv.Itoa(int(storePort)))
	t.Setenv("AIO_MQTT_USE_TLS", "false")
	t.Setenv("AIO_MQTT_CLIENT_ID", id)

	mc, err := mqtt.NewSessionClientFromEnv()
	if err != nil {
		t.Fatalf("mqtt.NewSessionClientFromEnv with the guide's settings: %v", err)
	}
	app, err := protocol.NewApplication()
	if err != nil {
		t.Fatal(err)
	}
	c := e.startClient(id, app, mc, slog.New(slog.DiscardHandler))

	key := e.key("guide")
	if _, err := c.ss.Set(e.ctx, key, "hello"); err != nil {
		t.Fatalf("Set: %v", err)
	}
	r, err := c.ss.Get(e.ctx, key)
	if err != nil || r.Value != "hello" {
		t.Fatalf("Get = %q, %v; want hello", r.Value, err)
	}
}
