//go:build unix

package proctest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// now is the wall clock in nanoseconds, the time base shared by the test
// and every process it starts (they run on one machine).
func now() int64 { return time.Now().UnixNano() }

// buildPrograms builds the state store and the candidate into dir, with
// nothing but the go command (and the module proxy).
func buildPrograms(ctx context.Context, dir string) (store, candidate string, err error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"github.com/dsslock/dsslock/cmd/statestore",
		"github.com/dsslock/dsslock/internal/proctest/candidate")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return filepath.Join(dir, "statestore"), filepath.Join(dir, "candidate"), nil
}

// freePort returns a free loopback port below the ephemeral range. The store
// must be restartable on the same port, and while it is down, clients keep
// connecting to it: a port in the ephemeral range could meanwhile become the
// source port of such a connection (which then connects to itself) or of
// any other, and the restart would find it taken.
func freePort() (int, error) {
	low := 32768 // Linux's default, and below the BSDs' and macOS's
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 12000 {
				low = n
			}
		}
	}
	for range 100 {
		port := 10000 + rand.IntN(low-10000) // not from the seed: runs of one seed at once would collide
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return port, ln.Close()
		}
	}
	return 0, fmt.Errorf("no free port found below %d", low)
}

// proc is a process the test started.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started int64         // just before it was started
	done    chan struct{} // closed once it exited and was reaped
	exited  int64         // when it was reaped
	waitErr error
	termed  bool // sent SIGTERM, to stop
}

// exitErr reports how p ended if that was not cleanly: an exit status other
// than 0, or a signal other than the SIGTERM that stopped it (which kills a
// process started so recently that its handler is not installed yet).
func (p *proc) exitErr() error {
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) && p.termed {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return p.waitErr
}

// signal sends sig to p.
func (p *proc) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.name, sig, err)
	}
	return nil
}

// kill kills p with SIGKILL, waits until it is reaped, and returns when the
// signal was sent.
func (p *proc) kill() (int64, error) {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return 0, err
	}
	at := now()
	<-p.done
	return at, nil
}

// startProc starts bin with args. Each line of one of its output streams
// (standard error if fromStderr, else standard output) is written to the
// file linesPath and passed to line; the other stream goes to the file
// otherPath.
func startProc(name, bin string, args []string, linesPath, otherPath string, fromStderr bool, line func(string)) (*proc, error) {
	out, err := os.Create(linesPath)
	if err != nil {
		return nil, err
	}
	other, err := os.Create(otherPath)
	if err != nil {
		out.Close()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	setProcAttr(cmd)
	var pipe io.ReadCloser
	if fromStderr {
		cmd.Stdout = other
		pipe, err = cmd.StderrPipe()
	} else {
		cmd.Stderr = other
		pipe, err = cmd.StdoutPipe()
	}
	if err != nil {
		out.Close()
		other.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, started: now(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		out.Close()
		other.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			_, _ = out.Write(append(sc.Bytes(), '\n'))
			line(sc.Text())
		}
		_, _ = io.Copy(out, pipe) // a line too long for the scanner: keep it for the reader
		p.waitErr = cmd.Wait()    // after every read of the pipe
		p.exited = now()
		out.Close()
		other.Close()
	}()
	return p, nil
}

// run is one run of the test: the processes, the faults and the record.
type run struct {
	cfg          config
	dir          string // logs
	storeBin     string
	candidateBin string
	addr         string

	mu     sync.Mutex
	stores []*proc       // every store process, in order
	cands  []*candidate  // every candidate process, in order of start
	faults []fault       // in the order they were healed
	errs   []string      // errors of the test itself (a bad event line, an unexpected exit)
	lastOK int64         // the latest acknowledged increment, by its time
	okCh   chan struct{} // a signal after each acknowledged increment
	evCh   chan struct{} // a signal after each event
	slots  []*candidate  // the current process of each candidate slot
}

// candidate is one candidate process and what it logged.
type candidate struct {
	*proc
	events string  // path of its event log
	log    []event // what it logged, in order
	killed int64   // when it was killed with SIGKILL (0: never)
	pauses []span  // its SIGSTOP intervals
}

// fault is one injected fault, with its interval (wall clock ns).
type fault struct {
	Kind   string `json:"kind"` // store-restart, store-pause, pause, kill
	Target string `json:"target"`
	From   int64  `json:"from"` // kill, SIGSTOP
	To     int64  `json:"to"`   // listening again, SIGCONT, the new candidate started
}

func (r *run) addFault(f fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// startStore starts a store process on r.addr and waits until it listens.
func (r *run) startStore(ctx context.Context) (*proc, error) {
	r.mu.Lock()
	name := fmt.Sprintf("store.%d", len(r.stores))
	r.mu.Unlock()
	listening := make(chan struct{})
	var once sync.Once
	args := []string{"-listen", r.addr}
	if r.cfg.persist {
		args = append(args, "-persist", "all", "-data-dir", filepath.Join(r.dir, "data"))
	}
	p, err := startProc(name, r.storeBin, args,
		filepath.Join(r.dir, name+".log"), filepath.Join(r.dir, name+".out"), true,
		func(line string) {
			if strings.Contains(line, "msg=listening") {
				once.Do(func() { close(listening) })
			}
		})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.stores = append(r.stores, p)
	r.mu.Unlock()
	select {
	case <-listening:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it listened (%v); see %s", name, p.waitErr, filepath.Join(r.dir, name+".log"))
	case <-time.After(10 * time.Second):
		_, _ = p.kill()
		return nil, fmt.Errorf("%s did not listen within 10 s", name)
	case <-ctx.Done():
		_, _ = p.kill()
		return nil, ctx.Err()
	}
}

// store returns the current store process.
func (r *run) store() *proc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stores[len(r.stores)-1]
}

// startCandidate starts a new candidate process in slot.
func (r *run) startCandidate(slot int) error {
	r.mu.Lock()
	gen := 0
	for _, c := range r.cands {
		if strings.HasPrefix(c.name, fmt.Sprintf("c%d.", slot)) {
			gen++
		}
	}
	r.mu.Unlock()
	name := fmt.Sprintf("c%d.%d", slot, gen)
	c := &candidate{events: filepath.Join(r.dir, name+".jsonl")}
	args := []string{"-addr", r.addr, "-id", name, "-ttl", r.cfg.ttl.String()}
	if r.cfg.broken {
		args = append(args, "-broken")
	}
	if os.Getenv("DSSLOCK_PROCTEST_DEBUG") != "" {
		args = append(args, "-debug")
	}
	switch r.cfg.mode {
	case "semaphore":
		args = append(args, "-mode", r.cfg.mode, "-limit", strconv.Itoa(r.cfg.limit))
	case "group":
		args = append(args, "-mode", r.cfg.mode, "-elections", strconv.Itoa(r.cfg.elections))
	}
	p, err := startProc(name, r.candidateBin, args, c.events, filepath.Join(r.dir, name+".log"), false,
		func(line string) { r.record(c, name, line) })
	if err != nil {
		return err
	}
	c.proc = p
	r.mu.Lock()
	r.cands = append(r.cands, c)
	r.slots[slot] = c
	r.mu.Unlock()
	return nil
}

// record keeps one line of the event log of c, named name (c.proc is not
// set yet when its first line comes), and signals an acknowledged increment.
func (r *run) record(c *candidate, name, line string) {
	var ev event
	err := json.Unmarshal([]byte(line), &ev)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errs = append(r.errs, fmt.Sprintf("%s: bad event line %q: %v", name, line, err))
		return
	}
	c.log = append(c.log, ev)
	select {
	case r.evCh <- struct{}{}:
	default:
	}
	if ev.Ev == "inc" && ev.Outcome == "ok" {
		r.lastOK = max(r.lastOK, ev.T)
		select {
		case r.okCh <- struct{}{}:
		default:
		}
	}
}

// waitWrite waits until some candidate's increment is acknowledged after
// since, and reports false if deadline or ctx came first.
func (r *run) waitWrite(ctx context.Context, since int64, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		r.mu.Lock()
		last := r.lastOK
		r.mu.Unlock()
		if last > since {
			return true
		}
		select {
		case <-r.okCh:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// waitFor waits until cond, called with r.mu held after each event (and at
// once), reports true, and reports false if deadline or ctx came first.
func (r *run) waitFor(ctx context.Context, deadline time.Time, cond func() bool) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-r.evCh:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// stopAll stops the candidates with SIGTERM, and then the store; any that
// takes longer than limit is killed, and recorded as killed.
func (r *run) stopAll(limit time.Duration) {
	var wg sync.WaitGroup
	for _, c := range r.slots {
		wg.Go(func() {
			if !stop(c.proc, limit) {
				c.killed, _ = c.kill()
			}
		})
	}
	wg.Wait()
	if p := r.store(); !stop(p, limit) {
		_, _ = p.kill()
	}
}

// stop sends p SIGTERM and reports whether it exited within limit.
func stop(p *proc, limit time.Duration) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	p.termed = true
	if p.signal(syscall.SIGTERM) != nil {
		<-p.done
		return true
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// killAll kills whatever still runs, for a test that ends early.
func (r *run) killAll() {
	r.mu.Lock()
	procs := append([]*proc(nil), r.stores...)
	for _, c := range r.cands {
		procs = append(procs, c.proc)
	}
	r.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.signal(syscall.SIGKILL)
			<-p.done
		}
	}
}
