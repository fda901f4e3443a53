#!/usr/bin/env bash
# Shows that the queue's simulation (TestQueueSimulation) has teeth: each
# patch here puts back a bug fixed in the queue's history (the commit is in
# its name; docs/design/queue.md, section 8), and the simulation must fail
# within the seeds CI runs. Run from the repository root:
#
#	bash lock/testdata/queuebugs/check.sh            # every patch
#	bash lock/testdata/queuebugs/check.sh 1324720    # the patches whose name matches
set -euo pipefail
cd "$(dirname "$0")/../../.."
root=$(pwd)
status=0
for p in lock/testdata/queuebugs/*.patch; do
	name=$(basename "$p" .patch)
	[[ -n "${1:-}" && "$name" != *"$1"* ]] && continue
	tmp=$(mktemp -d)
	git -C "$root" ls-files -z | (cd "$root" && xargs -0 tar -cf - 2>/dev/null) | tar -C "$tmp" -xf -
	(cd "$tmp" && patch -s -p1 < "$root/$p")
	out=$(cd "$tmp" && DSSLOCK_SIM_SEEDS=${SEEDS:-} go test -count=1 -run 'TestQueueSimulation$' ./lock/internal/wait/ 2>&1 || true)
	first=$(grep -m1 -o 'seed [0-9]*[^(]*' <<<"$out" || true)
	if grep -q '^--- FAIL: TestQueueSimulation' <<<"$out"; then
		echo "$name: caught: $first"
	else
		echo "$name: NOT caught"
		status=1
	fi
	rm -rf "$tmp"
done
exit $status
