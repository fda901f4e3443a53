#!/usr/bin/env bash
# Runs the official Azure IoT Operations Rust SDK against cmd/statestore:
# builds the store (Go) and the check (cargo, --locked), starts the store on a
# free loopback port, runs the check with the AIO_* settings of
# docs/sdk-guide.md, and stops the store (it must exit with status 0).
#
# The cargo build goes to DSSLOCK_RUST_TARGET (default
# ~/.cache/dsslock/rust-target), outside the clone, so a second run only
# relinks. Needs cargo, Go, and OpenSSL's headers with pkg-config (the SDK's
# MQTT crate links OpenSSL).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

if ! command -v cargo >/dev/null; then
	echo "interop/rust: cargo not found on PATH; install Rust (rustup) to run this check" >&2
	exit 2
fi
export CARGO_TARGET_DIR=${DSSLOCK_RUST_TARGET:-${HOME:-/tmp}/.cache/dsslock/rust-target}

tmp=$(mktemp -d)
store_pid=
stop_store() {
	[ -n "$store_pid" ] || return 0
	local pid=$store_pid status=0
	store_pid=
	kill -TERM "$pid" 2>/dev/null || true
	wait "$pid" || status=$?
	if [ "$status" -ne 0 ]; then
		echo "interop/rust: statestore exited with status $status after SIGTERM; its log:" >&2
		cat "$tmp/store.log" >&2
		return 1
	fi
}
cleanup() {
	local rc=$?
	stop_store || rc=1
	rm -rf "$tmp"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "interop/rust: go build ./cmd/statestore"
(cd "$root" && go build -o "$tmp/statestore" ./cmd/statestore)

echo "interop/rust: cargo build --locked (target dir $CARGO_TARGET_DIR)"
cargo build --locked --quiet --manifest-path "$here/Cargo.toml"

"$tmp/statestore" -listen 127.0.0.1:0 2>"$tmp/store.log" &
store_pid=$!
# Wait (at most 10 s) for the store's "msg=listening addr=HOST:PORT" line.
addr=
for _ in $(seq 100); do
	addr=$(sed -n 's/.*msg=listening addr=\([^ ]*\).*/\1/p' "$tmp/store.log" | head -n1)
	[ -n "$addr" ] && break
	kill -0 "$store_pid" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$addr" ]; then
	echo "interop/rust: statestore did not start listening; its log:" >&2
	cat "$tmp/store.log" >&2
	exit 1
fi
echo "interop/rust: statestore listening on $addr"

rc=0
AIO_BROKER_HOSTNAME=${addr%:*} AIO_BROKER_TCP_PORT=${addr##*:} AIO_MQTT_USE_TLS=false \
	AIO_MQTT_CLIENT_ID="dsslock-rust-$$" "$CARGO_TARGET_DIR/debug/dsslock-rust-sdk-check" || rc=$?
if [ "$rc" -ne 0 ]; then
	echo "interop/rust: the check failed (status $rc); the store's log:" >&2
	cat "$tmp/store.log" >&2
	exit "$rc"
fi
stop_store
