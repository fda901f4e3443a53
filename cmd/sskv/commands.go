package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/lock"
	"github.com/dsslock/dsslock/sskv"
)

// Exit statuses.
const (
	exitOK     = 0 // the command did what it was asked
	exitError  = 1 // connection or service error, unreadable file, ...
	exitUsage  = 2 // bad command line
	exitNotMet = 3 // not found, not applied, value differs
	exitLost   = 4 // lock: the lock was lost while COMMAND ran; elect: leadership was lost
)

const defaultAddr = "127.0.0.1:1883"

// defaultHandshake is how long a server has to answer once connected, by
// default: a live broker answers within a ping's time (sskv.DefaultPingTimeout),
// and a person waits.
const defaultHandshake = sskv.DefaultPingTimeout

// usageError is a bad command line: run prints it with the usage text and
// exits with exitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// connFlags are the connection flags, given before the command.
type connFlags struct {
	env          bool
	addr         string
	useTLS       bool
	caFile       string
	certFile     string
	keyFile      string
	insecure     bool
	user         string
	passwordFile string
	satFile      string
	clientID     string
	timeout      time.Duration
	handshake    time.Duration
	verbose      bool

	set map[string]bool // flags given explicitly
}

func newConnFlags(cf *connFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("sskv", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&cf.env, "env", false, "take the connection from the AIO_* environment (sskv.ConfigFromEnv);\nconnection flags given explicitly override it")
	fs.StringVar(&cf.addr, "addr", defaultAddr, "broker `host:port`")
	fs.BoolVar(&cf.useTLS, "tls", false, "connect with TLS (implied by -ca, -cert, -key, -insecure-skip-verify)")
	fs.StringVar(&cf.caFile, "ca", "", "PEM CA bundle `file` that verifies the broker (default: system roots)")
	fs.StringVar(&cf.certFile, "cert", "", "PEM client certificate `file` (with -key)")
	fs.StringVar(&cf.keyFile, "key", "", "PEM client private key `file` (with -cert)")
	fs.BoolVar(&cf.insecure, "insecure-skip-verify", false, "do not verify the broker's certificate (development only)")
	fs.StringVar(&cf.user, "user", "", "MQTT user `name`")
	fs.StringVar(&cf.passwordFile, "password-file", "", "`file` holding the MQTT password")
	fs.StringVar(&cf.satFile, "sat-file", "", "Kubernetes service account token `file` (K8S-SAT authentication)")
	fs.StringVar(&cf.clientID, "client-id", "", "MQTT client `id` (default: random)")
	durationFlag(fs, &cf.timeout, "timeout", sskv.DefaultRequestTimeout, "`DURATION` bound of the connection and of each request")
	durationFlag(fs, &cf.handshake, "handshake-timeout", defaultHandshake, "`DURATION` the server has to answer once connected (the TLS handshake, then MQTT's\nCONNACK): a server that accepts connections but says nothing is reported after it")
	fs.BoolVar(&cf.verbose, "v", false, "log the client's connection events to stderr")
	return fs
}

// cmdOpts are the flags of the commands; each command registers its own.
type cmdOpts struct {
	raw     bool
	nx      bool
	nex     bool
	px      time.Duration
	ft      hlc.Timestamp
	force   bool
	persist bool
	file    string
	ttl     time.Duration
	maxHold time.Duration
	limit   int
	read    bool // lock -r
	write   bool // lock -w
	listen  bool
	prio    int // elect -priority

	given map[string]bool // the command's flags given explicitly
}

type command struct {
	name     string
	args     string // synopsis of the arguments
	summary  string // one line, for the command list
	doc      string // the command's help
	flags    func(fs *flag.FlagSet, o *cmdOpts)
	minArgs  int
	maxArgs  int // -1: any number
	fileArgs bool
	check    func(o *cmdOpts, pos []string) error // more checks of the arguments, if any
}

func ftFlag(fs *flag.FlagSet, o *cmdOpts) {
	fs.Func("ft", "fencing `token` (an HLC version, such as the one a lock's set printed)", func(s string) error {
		t, err := hlc.Parse(s)
		if err != nil {
			return err
		}
		o.ft = t
		return nil
	})
	fs.BoolVar(&o.force, "force", false, "override the key's fencing token with a newer one made from this machine's clock:\nfor an operator resetting a fenced key by hand. It fences off the key's current\nholder, whose later fenced writes of the key the store then refuses")
}

// forceSkew is how far ahead of this machine's clock the token of a forced
// DEL or VDEL is: a key's token comes from the store's clock, which may be
// ahead, and the store accepts tokens up to 60 s ahead of its own. A forced
// SET stores its token with the key, so it uses the clock as it is: a
// token far ahead would fence off the next holders too.
const forceSkew = 30 * time.Second

// forceToken returns the fencing token of a forced write made now.
func forceToken(cmd string, now time.Time) hlc.Timestamp {
	if cmd != "set" {
		now = now.Add(forceSkew)
	}
	return hlc.Timestamp{Wall: now.UnixMilli(), Node: "sskv-force"}
}

// fencingHint says how to write a fenced key when a write without a token
// was refused. (A write refused for an older token is fencing at work: no
// hint to override it.)
func fencingHint(stderr io.Writer, cmd, key string, err error) {
	if errors.Is(err, sskv.ErrFencingTokenRequired) {
		fmt.Fprintf(stderr, "sskv: %s is protected by a fencing token: give -ft TOKEN (the holder's token, or a newer one),\nor reset it by hand with: sskv %s -force ... (this fences off the key's current holder)\n", strconv.Quote(key), cmd)
	}
}

func fileFlag(fs *flag.FlagSet, o *cmdOpts) {
	fs.StringVar(&o.file, "file", "", "read VALUE from `file` (\"-\": standard input) instead of the command line")
}

var commands = []*command{
	{
		name:    "get",
		args:    "[-raw] KEY",
		summary: "print the value and version of KEY",
		doc: `Prints the value of KEY on one line, then "(version V)"; with -raw, the
value's bytes alone. A value that is not printable UTF-8 (or is empty) is
printed quoted, Go-style. A missing key prints nothing on stdout and
NOT FOUND on stderr (stdout carries the value alone, and a value may read
NOT FOUND), and exits with status 3, as del and vdel of a missing key do:

	if v=$(sskv get -raw KEY); then ...; elif [ $? = 3 ]; then ...missing...; fi`,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			fs.BoolVar(&o.raw, "raw", false, "write the value's bytes exactly, and nothing else")
		},
		minArgs: 1, maxArgs: 1,
	},
	{
		name:    "set",
		args:    "KEY VALUE [-nx | -nex] [-px DURATION] [-ft TOKEN | -force] [-persist] [-file FILE]",
		summary: "set KEY to VALUE",
		doc: `Prints "OK V", V being the key's new version (a fencing token, when KEY is a
lock). When -nx or -nex keeps the value from being set, prints
"NOT APPLIED (current version V)" and exits with status 3.`,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			fs.BoolVar(&o.nx, "nx", false, "set only if KEY does not exist")
			fs.BoolVar(&o.nex, "nex", false, "set only if KEY does not exist or already holds VALUE (renews a lease)")
			fs.Func("px", "expire KEY after `DURATION` (10s, 1m30s, 500ms, or whole milliseconds)", func(s string) error {
				d, err := parsePX(s)
				o.px = d
				return err
			})
			ftFlag(fs, o)
			fs.BoolVar(&o.persist, "persist", false, "ask the service to persist KEY to disk")
			fileFlag(fs, o)
		},
		minArgs: 2, maxArgs: 2, fileArgs: true,
	},
	{
		name:    "del",
		args:    "KEY [-ft TOKEN | -force]",
		summary: "delete KEY",
		doc: `Prints "DELETED V", V being the version of the deleted value, or
"NOT FOUND" (exit status 3).`,
		flags:   ftFlag,
		minArgs: 1, maxArgs: 1,
	},
	{
		name:    "vdel",
		args:    "KEY VALUE [-ft TOKEN | -force] [-file FILE]",
		summary: "delete KEY if it holds VALUE",
		doc: `Prints "DELETED V", V being the version of the deleted value, "NOT FOUND",
or "VALUE DIFFERS (current version V)" (both exit status 3).`,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			ftFlag(fs, o)
			fileFlag(fs, o)
		},
		minArgs: 2, maxArgs: 2, fileArgs: true,
	},
	{
		name:    "watch",
		args:    "KEY [KEY...]",
		summary: "print the changes of the keys until interrupted",
		doc: `Prints one line per change, until SIGINT (Ctrl-C) or SIGTERM:

	TIME KEY OP VALUE VERSION [(resync)]

TIME is when the change was received, OP is SET or DELETE, VALUE is "-" for
DELETE, and is quoted, Go-style, when it is not printable UTF-8 or holds a
space; VERSION is "-" when unknown. The record of an election ("sskv elect",
package leader), or of a lock with lock.Config.FenceKey, is shown decoded:

	[holder=ID,token=T,value=V]    ID holds it; T is its fencing token
	[holder=ID,acquiring,value=V]  ID is taking it (its token comes next)

and any other value that starts with '[' is quoted, so none passes for one.
"(resync)" marks a line that sums up changes not seen one by one (during a
reconnect, or when the output was too slow). Changes made before the watch
started are not printed.`,
		minArgs: 1, maxArgs: -1,
	},
	{
		name:    "lock",
		args:    "[-ttl DURATION] [-max-hold DURATION] [-n N | -r | -w] NAME -- COMMAND [ARGS...]",
		summary: "run COMMAND while holding the lock NAME (or one of N slots, or to read or write)",
		doc: `Waits for the lock NAME (a key of the state store, held with package
github.com/dsslock/dsslock/lock), runs COMMAND while holding it, releases it
when COMMAND exits, and exits with COMMAND's status (128+N if a signal N
ended it). COMMAND's environment gets DSSLOCK_LOCK (NAME) and DSSLOCK_TOKEN,
the lock's fencing token as the store writes it, so that a script can make
fenced writes:

	sskv lock jobs/nightly -- sh -c 'sskv set -ft "$DSSLOCK_TOKEN" jobs/last "$(date)"'

If NAME is held when sskv starts to wait, it says by whom on stderr. A
value set by hand without expiry ("sskv set NAME VALUE") reads as a
holder's name, but is never released: sskv would wait for it forever,
until "sskv del NAME".

With -n N, NAME is a semaphore (lock.Semaphore): up to N commands run at
once, each holding one of its N slots, as "consul lock -n". COMMAND also
gets DSSLOCK_SLOT, the slot's number (0 to N-1); DSSLOCK_TOKEN is that
slot's token, which fences writes against the slot's earlier and later
holders (a key per slot, say, such as "jobs/upgrade/$DSSLOCK_SLOT"). The
first run writes N into the key NAME, and a run that gives another N fails
(the limit mismatch on stderr, exit status 1) rather than exceed it; to
change N, delete the key while no run holds a slot: "sskv del NAME".

	sskv lock -n 2 fleet/firmware -- ./upgrade.sh   # at most 2 at once

With -r or -w, NAME is a read-write lock (lock.RWMutex, up to 16 readers):
commands run with -r run together, up to 16 at once, and a command run
with -w runs alone. A -w run waits for the -r commands running, and -r
runs that start after it wait for it, so a stream of readers cannot keep
a writer out. DSSLOCK_TOKEN of a -w run is newer than that of every run,
-r or -w, that ended before it began: fence the writes with it.

	sskv lock -r config/site -- ./render.sh        # many at once
	sskv lock -w config/site -- ./update.sh        # alone

SIGINT and SIGTERM sent to sskv are passed on to COMMAND. The lock is
released only once COMMAND and every process it started have exited:
those it leaves running get SIGTERM when it exits, then SIGKILL a third of
the TTL later. If the lock is lost while COMMAND runs (no renewal
succeeded within two thirds of the TTL, or someone else took it), COMMAND
and every process it started get SIGTERM, then SIGKILL when the store could
expire the lock (a third of the TTL later), and sskv exits with status 4,
the reason on stderr. Give -- before COMMAND when it has flags.

With -max-hold D, the lock is given up D after it was taken even while
its renewals succeed (a hung COMMAND would otherwise keep it forever):
COMMAND is ended as for a lost lock, and sskv exits with status 4, saying
so on stderr. It applies to -n, -r and -w runs alike; a -w run's D counts
from when the -r runs before it have left.

If sskv itself ends (kill -9, a crash), COMMAND and every process it
started are killed at once, before the lock can expire: on Linux, sskv
runs COMMAND under a supervisor, a second sskv process that adopts every
process of COMMAND's tree, whatever process group or session it moves to,
and kills them all when sskv is gone. The supervisor has a process group
of its own, so that a kill of sskv's whole group (kill -9 %1 in a shell,
timeout -s KILL) leaves it to kill the rest; COMMAND stays in sskv's group
and gets the terminal's Ctrl-C as it would without sskv. If the supervisor
alone is killed (the OOM killer, a kill of its PID), sskv kills every
process COMMAND started, and releases the lock only once all are gone
(exit status 1, the reason on stderr). The supervisor is also a watchdog:
sskv sends it a heartbeat every TTL/12, and if none comes for TTL/4 (sskv
paused: SIGSTOP, a debugger, or stalled that long), it kills COMMAND's
whole tree at once with SIGKILL, before the lock can expire, and says so
on stderr; sskv, once it runs again, exits with status 4. So Ctrl-Z, which
stops sskv and COMMAND but not the supervisor, gets COMMAND killed TTL/4
later (a stopped sskv cannot renew the lock), and after fg sskv exits
with status 4. Still possible:
  - the whole machine pausing (a suspended VM, a laptop asleep) long
    enough for the lock to expire: COMMAND's processes may run on after
    the lock expired and another holder's COMMAND started;
  - the supervisor alone paused (SIGSTOP of its process): if the lock is
    lost meanwhile, COMMAND runs on until the supervisor resumes;
  - sskv and the supervisor (dsslock-supervisor) both killed, each by
    its PID or its command line (pkill -9 -f with a pattern that COMMAND's
    arguments also match): COMMAND gets SIGKILL too, but processes it
    started may run on;
  - processes COMMAND had others start, outside its tree (a service
    manager, at, a container runtime, ssh to another host), or that sskv
    may not signal (run as another user, by sudo say).
Elsewhere than on Linux there is no supervisor: signals and SIGKILL reach
COMMAND alone, and COMMAND runs on if sskv is killed or paused. Against
all of these, make COMMAND's writes fenced: "sskv set -ft $DSSLOCK_TOKEN"
(or the library's fenced package), which the store refuses once a later
holder has written the same key.`,
		flags: func(fs *flag.FlagSet, o *cmdOpts) {
			durationFlag(fs, &o.ttl, "ttl", lock.DefaultTTL, "the lease `DURATION`: how long the lock outlives its holder's last renewal")
			durationFlag(fs, &o.maxHold, "max-hold", 0, "give the lock up `DURATION` after taking it, even while renewals succeed (default: no cap)")
			fs.IntVar(&o.limit, "n", 0, "hold one of `N` slots of the semaphore NAME, so that up to N commands run at once\n(default: a lock, one at a time)")
			fs.BoolVar(&o.read, "r", false, "read: hold the read-write lock NAME for reading, beside other -r runs")
			fs.BoolVar(&o.write, "w", false, "write: hold the read-write lock NAME for writing, alone")
		},
		minArgs: 2, maxArgs: -1,
		check: func(o *cmdOpts, _ []string) error {
			if o.given["n"] && (o.limit < 1 || o.limit > 1000) {
				return usagef("-n %d: want 1 to 1000 slots", o.limit)
			}
			if n := btoi(o.given["n"]) + btoi(o.read) + btoi(o.write); n > 1 {
				return usagef("-n, -r and -w exclude each other: a lock is a semaphore or a read-write lock")
			}
			switch {
			case o.maxHold < 0 || o.maxHold%time.Millisecond != 0:
				return usagef("-max-hold %v: must be a positive whole number of milliseconds", o.maxHold)
			}
			return checkTTL(o.ttl)
		},
	},
	electCommand,
}

// minTTL is the shortest lease lock and elect take: a renewal every third
// of it must get its answer within two thirds of it, over a real network.
const minTTL = 100 * time.Millisecond

// durationFlag defines a duration flag whose errors say what is wrong with
// the value and what a valid one looks like.
func durationFlag(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Func(name, usage+" (default "+value.String()+")", func(s string) error {
		d, err := parseDuration(s)
		if err != nil {
			return err
		}
		*p = d
		return nil
	})
}

// parseDuration parses a Go duration such as 10s, 1m30s or 500ms, with
// errors a user can act on.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return 0, fmt.Errorf("missing unit: write %ss or %sms", s, s)
	}
	if durationSyntax.MatchString(s) {
		return 0, fmt.Errorf("invalid duration %q: out of range (at most %v)", s, time.Duration(math.MaxInt64))
	}
	return 0, errors.New("not a duration: write a number and a unit, such as 10s, 1m30s or 500ms")
}

// durationSyntax matches what time.ParseDuration takes, whatever the value.
var durationSyntax = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// checkTTL checks the value of -ttl for lock and elect, before connecting.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0 || ttl%time.Millisecond != 0:
		return usagef("-ttl %v: must be a positive whole number of milliseconds", ttl)
	case ttl < minTTL:
		return usagef("-ttl %v: must be at least %v, so that renewals can get their answers in time", ttl, minTTL)
	}
	return nil
}

// maxPX is the longest expiry -px takes: the longest time.Duration, in whole
// milliseconds (about 292 years).
const maxPX = time.Duration(math.MaxInt64 / int64(time.Millisecond) * int64(time.Millisecond))

// parsePX parses the value of -px: a Go duration or a whole number of
// milliseconds, from 1ms to maxPX. A value out of that range is refused,
// never wrapped around or truncated into another expiry.
func parsePX(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		ms, err2 := strconv.ParseInt(s, 10, 64)
		switch {
		case errors.Is(err2, strconv.ErrRange) || err2 == nil && ms > int64(maxPX/time.Millisecond):
			return 0, fmt.Errorf("%s ms is out of range (at most %d ms, %v)", s, maxPX/time.Millisecond, maxPX)
		case err2 != nil:
			if _, perr := parseDuration(s); perr != nil {
				return 0, perr
			}
			return 0, err // time.ParseDuration also refuses durations out of range
		}
		d = time.Duration(ms) * time.Millisecond
	}
	switch {
	case d < time.Millisecond:
		return 0, errors.New("must be at least 1ms")
	case d%time.Millisecond != 0:
		return 0, fmt.Errorf("%v is not a whole number of milliseconds, the store's unit for PX", d)
	}
	return d, nil
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func (c *command) flagSet(o *cmdOpts) *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if c.flags != nil {
		c.flags(fs, o)
	}
	return fs
}

func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: sskv [connection flags] %s %s\n\n%s\n", c.name, c.args, c.doc)
	fs := c.flagSet(&cmdOpts{})
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintf(w, "\nFlags (before or after the arguments; use -- before a VALUE that starts with '-'):\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	fmt.Fprintf(w, "\nRun 'sskv -h' for the connection flags.\n")
}

// usage prints the usage text. (A usage error prints only where to read it:
// see usageFail.)
func usage(w io.Writer) {
	fmt.Fprintf(w, `Usage: sskv [connection flags] COMMAND [arguments]

sskv reads, writes and watches keys of the Azure IoT Operations state store.

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %s\n          %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintf(w, `  help    [COMMAND]
          show the help of COMMAND
  version
          print the version of sskv

Output: stdout carries each command's result, stderr the rest. set, del
and vdel print their outcome there (OK, NOT APPLIED, DELETED, NOT FOUND,
VALUE DIFFERS); get prints the value alone, so a missing key prints
NOT FOUND on stderr instead. The exit status tells the outcomes apart.

Exit status: 0 done; 1 error; 2 bad usage; 3 condition not met (get of a
missing key, set not applied, del or vdel of a missing key, vdel of another
value); lock: COMMAND's status, or 4 if the lock was lost while it ran;
elect: 4 if leadership was lost.
`)
	fmt.Fprintf(w, "\nConnection flags:\n")
	fs := newConnFlags(&connFlags{})
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, `
With -env, the connection comes from AIO_BROKER_HOSTNAME, AIO_BROKER_TCP_PORT,
AIO_MQTT_USE_TLS, AIO_MQTT_CLIENT_ID, AIO_MQTT_USERNAME, AIO_MQTT_PASSWORD_FILE,
AIO_SAT_FILE, AIO_TLS_CA_FILE, AIO_TLS_CERT_FILE, AIO_TLS_KEY_FILE, ... as in
an Azure IoT Operations pod. If AIO_MQTT_CLIENT_ID is set, sskv connects with
that client id, which disconnects any other client using it: give -client-id
when running next to the application the environment belongs to.

Examples:
  statestore &                           # a local store on 127.0.0.1:1883
  sskv set greeting hello
  sskv get greeting
  sskv set lock me -nx -px 10s           # prints OK V: V is a fencing token
  sskv set data v1 -ft V                 # refused once data has a newer token
  sskv vdel lock me
  sskv watch greeting lock               # until Ctrl-C
  sskv elect svc/leader 10.0.0.5:8080    # prints "leader 10.0.0.5:8080 TOKEN" once elected
  sskv elect -l svc/leader               # who leads, and each change, until Ctrl-C
  echo -n payload | sskv set blob -file -
  sskv -addr aio-broker:18883 -tls -ca ca.pem -sat-file /var/run/secrets/tokens/broker-sat get k
  sskv -env watch k
`)
}

// parseInterspersed parses fs from args, allowing flags after positional
// arguments, and returns the positional arguments. Everything after "--" is
// positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// isHelpFlag reports whether arg asks for help, as the flag package takes it.
func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

// run runs the command line args (without the program name) and returns the
// exit status.
