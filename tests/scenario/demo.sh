#!/usr/bin/env bash
# `make demo` end to end: the seed's failure shows, the fix holds, nothing is left behind.
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
[ "$(id -u)" = 0 ] || { echo "SKIP: the demo needs root (runc, mknod)"; exit 77; }
command -v runc >/dev/null || { echo "SKIP: runc is not installed"; exit 77; }
. "$src/scripts/lib/bundle.sh"
why=$(gf_runc_preflight "${GPUFENCE_BUILD_DIR:?}/bin/gpufence-probe") || { echo "SKIP: $why"; exit 77; }
before_dirs=$(ls -d /tmp/gpufence-demo-* 2>/dev/null | wc -l)
out=$(bash "$src/scripts/demo.sh" 2>&1)
rc=$?
echo "$out"
fail=0
expect() { grep -qE -- "$1" <<<"$out" || { echo "FAIL: expected /$1/"; fail=1; }; }
[ "$rc" = 0 ] || { echo "FAIL: demo exited $rc"; fail=1; }
expect '^before: runc .* ds-0 .*LEAK: reaches GPU 1'
expect '^before: runc .* ds-1 .*LEAK: reaches GPU 0'
expect '^after: gpufence-runtime +ds-0 +GPU 0 +OPEN / OPEN +absent / denied .*ISOLATED'
expect '^after: gpufence-runtime +ds-1 +GPU 1 +absent / denied +OPEN / OPEN .*ISOLATED'
expect 'event=plugin.allocate resource=nvidia.com/gpu'
after_dirs=$(ls -d /tmp/gpufence-demo-* 2>/dev/null | wc -l)
[ "$after_dirs" -le "$before_dirs" ] || { echo "FAIL: demo left a temp dir behind"; fail=1; }
pgrep -f 'gpufence-device-plugin --plugin-dir /tmp/gpufence-demo' >/dev/null && { echo "FAIL: plugin still running"; fail=1; }
exit $fail
