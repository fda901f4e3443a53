package interop

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
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

// guideSnippetMarker precedes, in docs/sdk-guide.md, the Go program that
// TestGuideFirstCall builds and runs.
const guideSnippetMarker = "<!-- checked by interop TestGuideFirstCall -->"

// guideSnippet returns the first ```go block after the marker in
// docs/sdk-guide.md.
func guideSnippet(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "sdk-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), guideSnippetMarker)
	if !ok {
		t.Fatalf("docs/sdk-guide.md has no %q", guideSnippetMarker)
	}
	_, rest, ok = strings.Cut(rest, "```go\n")
	if !ok {
		t.Fatal("docs/sdk-guide.md: no ```go block after the marker")
	}
	code, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("docs/sdk-guide.md: the ```go block after the marker does not end")
	}
	return code
}

// TestGuideFirstCall builds the Go program of docs/sdk-guide.md ("The first
// call") as a program of its own, with this module's pinned SDK versions, and
// runs it against the store with the guide's AIO_* settings: it must print
// the value it set.
func TestGuideFirstCall(t *testing.T) {
	e := newEnv(t)
	code := guideSnippet(t)

	// A module of its own beside nothing: this module's requirements (the
	// SDK versions CI runs), the parent module by absolute path, no network.
	dir := t.TempDir()
	parent, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(e.ctx, buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	goCmd("mod", "edit", "-module", "guidefirstcall", "-replace", "github.com/dsslock/dsslock="+parent)
	bin := filepath.Join(dir, "firstcall")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race") // reuses what the test binary's build compiled
	}
	goCmd(append(args, ".")...)

	host := storeHost
	if host == "127.0.0.1" {
		host = "localhost"
	}
	ctx, cancel := context.WithTimeout(e.ctx, waitTimeout+connectTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AIO_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env,
		"AIO_BROKER_HOSTNAME="+host,
		"AIO_BROKER_TCP_PORT="+strconv.Itoa(int(storePort)),
		"AIO_MQTT_USE_TLS=false",
		"AIO_MQTT_CLIENT_ID=guide-first-call-"+randHex(4),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the guide's program: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `greeting = "hello"`) {
		t.Errorf("the guide's program printed %q, want it to contain greeting = \"hello\"", out)
	}
}
