package dsslockprom_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/prometheus"
	"github.com/dsslock/dsslock/sskv"
	"github.com/dsslock/dsslock/sskv/localstore"
)

// A candidate that exports its client's and its election's metrics on
// /metrics, here against an embedded local store.
func Example() {
	srv, err := localstore.Start(localstore.Config{})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	reg := prometheus.NewRegistry()
	m, err := dsslockprom.New(reg)
	if err != nil {
		panic(err)
	}
	c, err := sskv.Dial(ctx, sskv.Config{Addr: srv.Addr(), Metrics: m.Client()})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	web := httptest.NewServer(mux) // http.ListenAndServe(":9090", mux) in a service
	defer web.Close()

	e, err := leader.NewElector(c, "orders/leader", []byte("10.0.0.5:8080"),
		leader.WithMetrics(m.Election("orders/leader")))
	if err != nil {
		panic(err)
	}
	_ = e.Run(ctx, func(ctx context.Context, _ *leader.Term) error {
		// While leading, scrape /metrics as Prometheus would.
		res, err := http.Get(web.URL + "/metrics")
		if err != nil {
			return err
		}
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "dsslock_leader_leading") || strings.HasPrefix(line, "dsslock_sskv_connected") {
				fmt.Println(line)
			}
		}
		return nil // done: Run resigns and returns
	})
	// Output:
	// dsslock_leader_leading{election="orders/leader"} 1
	// dsslock_sskv_connected 1
}
