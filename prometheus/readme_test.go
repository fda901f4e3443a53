//lint:file-ignore SA4006 the README snippet compiled here leaves out its error checks, as README snippets do
package dsslockprom_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/prometheus"
	"github.com/dsslock/dsslock/sskv"
)

// readmeMetrics is the main README's Metrics snippet, compiled.
func readmeMetrics(ctx context.Context, addr string, value []byte) error {
	reg := prometheus.NewRegistry()
	m, err := dsslockprom.New(reg)
	c, err := sskv.Dial(ctx, sskv.Config{Addr: addr, Metrics: m.Client()})
	e, err := leader.NewElector(c, "orders/leader", value, leader.WithMetrics(m.Election("orders/leader")))
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_ = e
	return err
}

var _ = readmeMetrics

// TestREADMESnippet checks that the main README's snippet marked as
// compiled here is the one above, line for line.
func TestREADMESnippet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "<!-- compiled in prometheus/readme_test.go -->\n```go\n")
	if !ok {
		t.Fatal("README.md has no snippet marked as compiled here")
	}
	snippet, _, _ := strings.Cut(after, "```")
	if !strings.Contains(normalize(string(self)), normalize(snippet)) {
		t.Errorf("README's Metrics snippet is not the one compiled in readme_test.go:\n%s", snippet)
	}
}

func normalize(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}
