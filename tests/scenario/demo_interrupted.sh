#!/usr/bin/env bash
# `make demo` interrupted part-way still cleans up: no temp dir, no plugin process, no
# container left running.
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
[ "$(id -u)" = 0 ] || { echo "SKIP: the demo needs root (runc, mknod)"; exit 77; }
command -v runc >/dev/null || { echo "SKIP: runc is not installed"; exit 77; }
. "$src/scripts/lib/bundle.sh"
why=$(gf_runc_preflight "${GPUFENCE_BUILD_DIR:?}/bin/gpufence-probe") || { echo "SKIP: $why"; exit 77; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
before=$(ls -d /tmp/gpufence-demo-* 2>/dev/null)
setsid bash "$src/scripts/demo.sh" > "$log" 2>&1 &
pid=$!
# Wait until the device plugin is up and the first containers run, then interrupt the group.
for _ in $(seq 1200); do grep -q "Running two DeepStream" "$log" && break; sleep 0.05; done
dir=$(ls -d /tmp/gpufence-demo-* 2>/dev/null | grep -vxF -- "$before" | head -1)  # this run's
# A background job of a non-interactive shell ignores SIGINT, so interrupt with SIGTERM, which
# the demo traps the same way.
kill -TERM -- -"$pid"
wait "$pid"
rc=$?
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: an interrupted demo should not exit 0"; fail=1; }
[ -n "$dir" ] || { echo "FAIL: the demo never created its work dir"; cat "$log"; fail=1; }
[ -n "$dir" ] && [ -e "$dir" ] && { echo "FAIL: $dir left behind"; fail=1; }
for _ in $(seq 100); do { [ -n "$dir" ] && pgrep -f "$dir" >/dev/null; } || break; sleep 0.05; done  # killed shims may lag
if [ -n "$dir" ] && pgrep -f "$dir" >/dev/null; then echo "FAIL: processes of $dir still run:"; pgrep -af "$dir"; fail=1; fi
[ "$fail" = 0 ] && echo "ok - interrupted demo (exit $rc) cleaned up $dir"
exit $fail
