// Command sskv reads, writes and watches keys of the Azure IoT Operations
// state store, through the client in package
// github.com/dsslock/dsslock/sskv. It is the first thing to run to see what
// is in a store.
//
// Against a local store (go run ./cmd/statestore serves one on
// 127.0.0.1:1883, the default address):
//
//	go run ./cmd/sskv set greeting hello
//	go run ./cmd/sskv get greeting
//	go run ./cmd/sskv set lock me -nx -px 10s     # OK <version>: a fencing token
//	go run ./cmd/sskv set data v1 -ft 001714000000000:00000:statestore
//	go run ./cmd/sskv vdel lock me
//	go run ./cmd/sskv watch greeting lock         # until Ctrl-C
//	go run ./cmd/sskv elect svc/leader me         # "leader me TOKEN", until Ctrl-C
//	go run ./cmd/sskv elect -l svc/leader         # who leads, and each change
//	echo -n payload | go run ./cmd/sskv set blob -file -
//	go run ./cmd/sskv get -raw blob > blob.bin
//
// Against a broker of Azure IoT Operations, with connection flags before the
// command, or the AIO_* environment of a pod with -env:
//
//	go run ./cmd/sskv -addr aio-broker:18883 -tls -ca ca.pem \
//		-sat-file /var/run/secrets/tokens/broker-sat get mykey
//	go run ./cmd/sskv -env watch mykey
//
// Exit status: 0 when the command did what it was asked; 1 on an error
// (connection, refused by the service, ...); 2 on bad usage; 3 when a
// condition was not met: get of a missing key, set not applied (-nx, -nex),
// del or vdel of a missing key, vdel of a key that holds another value;
// 4 when lock or elect lost what they held (see "help lock", "help elect").
// Standard output carries each command's result: set, del and vdel print
// their outcome there (OK, NOT APPLIED, DELETED, NOT FOUND, ...); get prints
// the value alone, and NOT FOUND on standard error for a missing key.
//
// Run "go run ./cmd/sskv -h" or "... help COMMAND" for every flag.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
