// Command activestandby is a service that runs as several replicas of which
// exactly one is active: it does the work, and another replica takes over
// within moments when it stops. It is meant to be copied as the skeleton of
// such a service; the work here increments a counter in the state store.
//
// Run a local state store and two replicas, each in a terminal of its own:
//
//	go run ./cmd/statestore
//	go run ./examples/activestandby -id a
//	go run ./examples/activestandby -id b -http :8081
//
// One replica logs "elected" and then "work done" every second, with the
// counter it incremented; the other logs "new leader" and waits, sending
// nothing while the leader renews its term. Then:
//
//   - Ctrl-C the active replica: its work stops, it resigns (deleting the
//     election's key) and exits; the other logs "elected" within
//     milliseconds and the counter goes on from where it was.
//   - kill -9 the active replica: nobody resigns, and the other takes over
//     when the key expires, within -ttl (5 s) of the last renewal.
//   - Freeze it (kill -STOP, and kill -CONT some seconds later): the other
//     takes over once the key expires; the frozen one, when it wakes, finds
//     its term over on its own clock, so its work stops before writing
//     anything, and it becomes a standby.
//
// Each replica serves its health check on -http, for a liveness probe: 200
// unless the process still acts as leader after its term ended (its work
// ignored the end of the term). /status says who leads:
//
//	curl localhost:8080/healthz
//	curl localhost:8080/status    # {"id":"a","leading":true,"leader":"a","token":"..."}
//
// Every write of the work is fenced with the term's token (fenced.New(client,
// term)): the store refuses it once a newer leader has written the key, so a
// replica that lost leadership without knowing it yet (a frozen process, a
// request stuck in the network) cannot overwrite the new leader's writes.
//
// In an Azure IoT Operations pod, give -env to connect with the AIO_*
// environment (sskv.ConfigFromEnv); -id defaults to the host name, which is
// the pod's name.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/dsslock/dsslock/fenced"
	"github.com/dsslock/dsslock/leader"
	"github.com/dsslock/dsslock/sskv"
)

// counterKey is the key the active replica's work increments.
const counterKey = "activestandby/counter"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := run(ctx, os.Args[1:], log)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activestandby:", err)
		os.Exit(1)
	}
}

// run runs a replica with the command line args until ctx ends.
func run(ctx context.Context, args []string, log *slog.Logger) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("activestandby", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:1883", "state store (MQTT broker) `host:port`")
	env := fs.Bool("env", false, "connect with the AIO_* environment of an Azure IoT Operations pod instead of -addr")
	id := fs.String("id", host, "this replica's name, published while it leads")
	election := fs.String("election", "activestandby/leader", "the election's key")
	ttl := fs.Duration("ttl", 5*time.Second, "the lease: a leader that stops renewing is replaced this long after its last renewal")
	httpAddr := fs.String("http", ":8080", "`address` of the health check (/healthz) and /status; empty: none")
	_ = fs.Parse(args) // exits on a bad flag
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case *id == "":
		return errors.New("-id is required")
	}
	log = log.With("id", *id)

	cfg := sskv.Config{Addr: *addr}
	if *env {
		var err error
		if cfg, err = sskv.ConfigFromEnv(); err != nil {
			return err
		}
	}
	cfg.Logger = log // connection lost and restored
	log.Info("connecting to the state store", "addr", cfg.Addr)
	c, err := sskv.Dial(ctx, cfg) // retries until the store answers, or ctx ends
	if err != nil {
		return err
	}
	defer c.Close()

	e, err := leader.NewElector(c, *election, []byte(*id),
		leader.WithTTL(*ttl),
		leader.WithLogger(log), // elected, lost
		leader.OnNewLeader(func(s leader.State) {
			if s.HasLeader() {
				log.Info("new leader", "leader", string(s.Value), "token", s.Token)
			} else {
				log.Info("no leader")
			}
		}),
		leader.OnStoppedLeading(func(reason error) { log.Info("stopped leading", "reason", reason) }),
	)
	if err != nil {
		return err
	}

	if *httpAddr != "" {
		stop, err := serveHTTP(*httpAddr, c, e, *id, *election, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	// Run campaigns, runs the work while this replica leads, and campaigns
	// again when leadership is lost, until ctx ends; then it waits for the
	// work to return and resigns, so that another replica takes over at
	// once.
	err = e.Run(ctx, func(ctx context.Context, t *leader.Term) error {
		return work(ctx, c, t, log)
	})
	if ctx.Err() != nil {
		return nil // stopped, and resigned
	}
	return err
}

// work is what the active replica does: increment the counter now and every
// second, with a fenced read-modify-write. It returns when ctx ends (the
// term ended, or the process stops): then it must stop at once, since
// another replica may take over moments later.
func work(ctx context.Context, c *sskv.Client, t *leader.Term, log *slog.Logger) error {
	w := fenced.New(c, t) // every write carries the term's fencing token
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var n int
		_, err := w.Edit(ctx, counterKey, func(v []byte, found bool) ([]byte, error) {
			n = 0
			if found {
				var err error
				if n, err = strconv.Atoi(string(v)); err != nil {
					return nil, fmt.Errorf("%s holds %q, not a number", counterKey, v)
				}
			}
			n++
			return strconv.AppendInt(nil, int64(n), 10), nil
		})
		switch {
		case err == nil:
			log.Info("work done", "counter", n, "token", t.Token())
		case ctx.Err() != nil:
			return nil // the term ended (the elector logs why), or the process stops
		case errors.Is(err, fenced.ErrStale):
			// A newer leader has written the key: this term is over (the
			// writer has told it) and ctx ends now.
			log.Warn("write refused: a newer leader exists", "error", err)
			return nil
		default:
			log.Warn("work failed; trying again in a second", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// serveHTTP serves the elector's health check at /healthz, and at /status
// this replica's view of the election. stop shuts the server down.
func serveHTTP(addr string, c *sskv.Client, e *leader.Elector, id, election string, log *slog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", e)
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		st := struct {
			ID      string `json:"id"`
			Leading bool   `json:"leading"`
			Leader  string `json:"leader,omitempty"`
			Token   string `json:"token,omitempty"`
		}{ID: id, Leading: e.Leading()}
		s, err := leader.Leader(r.Context(), c, election)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if s.HasLeader() {
			st.Leader, st.Token = string(s.Value), s.Token.String()
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	log.Info("serving /healthz and /status", "addr", ln.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server", "error", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-served
	}, nil
}
