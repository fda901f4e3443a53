package interop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// addrEnv names the environment variable that points the suite at an already
// running state store instead of building and starting ../cmd/statestore.
const addrEnv = "DSSLOCK_STATESTORE_ADDR"

const (
	buildTimeout    = 5 * time.Minute
	listenTimeout   = 60 * time.Second
	shutdownTimeout = 10 * time.Second
)

var (
	// storeHost and storePort are where the state store under test listens.
	storeHost string
	storePort uint16

	// storeLog collects the child's stderr and stdout, line by line. It is
	// empty when the store is external (DSSLOCK_STATESTORE_ADDR).
	storeLog = &lineLog{}
	// storePID is the process id of the state store this suite started; 0
	// when it is external.
	storePID int
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if addr := os.Getenv(addrEnv); addr != "" {
		if err := setStoreAddr(addr); err != nil {
			fmt.Fprintf(os.Stderr, "interop: %s=%q: %v\n", addrEnv, addr, err)
			return 1
		}
		if err := preflight(); err != nil {
			fmt.Fprintf(os.Stderr, "interop: state store at %s (from %s) is not reachable: %v\n", addr, addrEnv, err)
			return 1
		}
		return m.Run()
	}

	tmp, err := os.MkdirTemp("", "dsslock-interop-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "interop: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)

	bin := filepath.Join(tmp, "statestore")
	if err := buildStore(bin); err != nil {
		fmt.Fprintf(os.Stderr, "interop: %v\n", err)
		return 1
	}

	proc, err := startStore(bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "interop: %v\n", err)
		dumpStoreLog(os.Stderr)
		return 1
	}

	code := m.Run()

	if err := proc.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "interop: FAIL: state store did not shut down cleanly on SIGTERM: %v\n", err)
		dumpStoreLog(os.Stderr)
		return 1
	}
	if code != 0 {
		// Failed tests already printed their share of the store log; keep the
		// full log out of the way unless asked for.
		if os.Getenv("DSSLOCK_INTEROP_STORE_LOG") != "" {
			dumpStoreLog(os.Stderr)
		}
	}
	return code
}

// buildStore builds the local state store program of the parent module (with
// -race when the tests run with it). The
// package path is relative to the parent module's root, which is where the
// build runs (a module cannot build a directory outside itself).
func buildStore(bin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()

	args := []string{"build", "-o", bin}
	if raceEnabled {
		// Under go test -race, race-check the store too: a data race it
		// reports makes it exit non-zero, which fails the run at shutdown.
		args = append(args, "-race")
	}
	args = append(args, "./cmd/statestore")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build ../cmd/statestore: %w\n%s", err, out)
	}
	return nil
}

type storeProcess struct {
	cmd     *exec.Cmd
	cancel  context.CancelFunc
	exited  chan struct{} // closed once waitErr is set
	waitErr error
}

var listeningAddr = regexp.MustCompile(`(?:^|\s)addr=("(?:[^"\\]|\\.)*"|\S+)`)

// parseListening extracts addr= from a slog text line with msg=listening.
func parseListening(line string) (string, bool) {
	if !strings.Contains(line, "msg=listening") {
		return "", false
	}
	m := listeningAddr.FindStringSubmatch(line)
	if m == nil {
		return "", false
	}
	addr := m[1]
	if strings.HasPrefix(addr, `"`) {
		u, err := strconv.Unquote(addr)
		if err != nil {
			return "", false
		}
		addr = u
	}
	return addr, true
}

func startStore(bin string) (*storeProcess, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-listen", "127.0.0.1:0")
	cmd.Stdout = storeLog.writer("stdout: ")
	setProcAttr(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}

	p := &storeProcess{cmd: cmd, cancel: cancel, exited: make(chan struct{})}
	storePID = cmd.Process.Pid
	addrCh := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		found := false
		for sc.Scan() {
			line := sc.Text()
			storeLog.add(line)
			if !found {
				if addr, ok := parseListening(line); ok {
					found = true
					addrCh <- addr
				}
			}
		}
		// Keep draining whatever is left so the child never blocks on stderr.
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() {
		<-scanned // all reads from the pipe must finish before Wait
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	select {
	case addr := <-addrCh:
		if err := setStoreAddr(addr); err != nil {
			_ = p.kill()
			return nil, fmt.Errorf("state store logged msg=listening with unusable addr=%q: %v", addr, err)
		}
		if err := preflight(); err != nil {
			_ = p.kill()
			return nil, fmt.Errorf("state store logged addr=%s but does not accept TCP connections: %v", addr, err)
		}
		return p, nil
	case <-p.exited:
		cancel()
		return nil, fmt.Errorf("state store exited before logging msg=listening: %v", p.waitErr)
	case <-time.After(listenTimeout):
		_ = p.kill()
		return nil, fmt.Errorf("state store did not log msg=listening within %s", listenTimeout)
	}
}

// stop sends SIGTERM and waits (bounded) for a clean exit with status 0.
func (p *storeProcess) stop() error {
	defer p.cancel()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		select {
		case <-p.exited:
			return fmt.Errorf("state store had already exited before SIGTERM: %v", p.waitErr)
		default:
		}
		return fmt.Errorf("send SIGTERM: %w", err)
	}
	select {
	case <-p.exited:
	case <-time.After(shutdownTimeout):
		_ = p.kill()
		return fmt.Errorf("still running %s after SIGTERM; killed", shutdownTimeout)
	}
	if p.waitErr != nil {
		var ee *exec.ExitError
		if errors.As(p.waitErr, &ee) {
			return fmt.Errorf("exit status after SIGTERM: %v (want exit code 0)", ee.ProcessState)
		}
		return p.waitErr
	}
	return nil
}

func (p *storeProcess) kill() error {
	p.cancel() // CommandContext kills the process
	select {
	case <-p.exited:
		return nil
	case <-time.After(shutdownTimeout):
		return errors.New("process did not exit after SIGKILL")
	}
}

func setStoreAddr(addr string) error {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return fmt.Errorf("port: %w", err)
	}
	if port == 0 {
		return errors.New("port 0")
	}
	if host == "" {
		host = "127.0.0.1"
	}
	storeHost, storePort = host, uint16(port)
	return nil
}

// preflight makes an unreachable store fail the run at once instead of every
// test waiting for its MQTT connect to give up.
func preflight() error {
	conn, err := net.DialTimeout("tcp", storeAddress(), 5*time.Second)
	if err != nil {
		return err
	}
	return conn.Close()
}

func storeAddress() string {
	return net.JoinHostPort(storeHost, strconv.Itoa(int(storePort)))
}

func dumpStoreLog(w io.Writer) {
	lines := storeLog.since(0)
	fmt.Fprintf(w, "---- state store log (%d lines) ----\n", len(lines))
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w, "---- end of state store log ----")
}

func TestParseListening(t *testing.T) {
	for _, tc := range []struct {
		line, want string
		ok         bool
	}{
		{`time=2025-01-01T00:00:00.000Z level=INFO msg=listening addr=127.0.0.1:40123`, "127.0.0.1:40123", true},
		{`time=x level=INFO msg=listening addr="127.0.0.1:1883" other=1`, "127.0.0.1:1883", true},
		{`time=x level=INFO msg=listening addr=[::1]:1883`, "[::1]:1883", true},
		{`time=x level=INFO msg=starting addr=127.0.0.1:1883`, "", false},
		{`time=x level=INFO msg=listening`, "", false},
		{`time=x level=INFO msg=listening xaddr=1.2.3.4:5`, "", false},
	} {
		got, ok := parseListening(tc.line)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseListening(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
