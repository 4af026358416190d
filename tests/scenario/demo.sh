#!/usr/bin/env bash
# `make demo` end to end: the seed's failure shows, the fix holds, nothing is left behind.
# Usage: demo.sh [cri|runc]
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
[ "$(id -u)" = 0 ] || { echo "SKIP: the demo needs root (runc, mknod)"; exit 77; }
command -v runc >/dev/null || { echo "SKIP: runc is not installed"; exit 77; }
. "$src/scripts/lib/bundle.sh"
why=$(gf_runc_preflight "${GPUFENCE_BUILD_DIR:?}/bin/gpufence-probe") || { echo "SKIP: $why"; exit 77; }
mode=${1:-cri}  # cri: through containerd's CRI (skips when containerd cannot run); runc: runc alone
before_dirs=$(ls -d /tmp/gpufence-demo-* 2>/dev/null | wc -l)
if [ "$mode" = runc ]; then
  out=$(GPUFENCE_DEMO_RUNC=1 bash "$src/scripts/demo.sh" 2>&1)
else
  out=$(bash "$src/scripts/demo.sh" 2>&1)
fi
rc=$?
echo "$out"
fail=0
expect() { grep -qE -- "$1" <<<"$out" || { echo "FAIL: expected /$1/"; fail=1; }; }
[ "$rc" = 0 ] || { echo "FAIL: demo exited $rc"; fail=1; }
if [ "$mode" = cri ] && grep -q '^make demo: containerd cannot run here' <<<"$out"; then
  echo "SKIP: containerd cannot run here ($(grep -m1 '^SKIP' <<<"$out")); demo.runc covers the runc demo"
  exit 77
fi
expect '^before: runc .* ds-0 .*LEAK: reaches GPU 1'
expect '^before: runc .* ds-1 .*LEAK: reaches GPU 0'
if [ "$mode" = runc ]; then
  expect '^after: gpufence-runtime +ds-0 +GPU 0 +OPEN / OPEN +absent / denied .*ISOLATED'
  expect '^after: gpufence-runtime +ds-1 +GPU 1 +absent / denied +OPEN / OPEN .*ISOLATED'
else
  # Through the CRI: the privileged pods see the node's /dev (both GPU nodes), list GPUs, and run
  # the apps; the seed's symptom is both apps on GPU 0 (docs/containerd-lines.md, check 5).
  expect 'through containerd 1\.6|^containerd 1\.6'
  expect '^before: runc .* ds-0 +GPU 0 +OPEN / OPEN +OPEN / OPEN +2 +GPU 0 .*LEAK: reaches GPU 1$'
  expect '^before: runc .* ds-1 +GPU 1 +OPEN / OPEN +OPEN / OPEN +2 +GPU 0 .*LEAK: reaches GPU 0, runs on GPU 0$'
  expect '^after: gpufence-runtime +ds-0 +GPU 0 +OPEN / OPEN +denied / denied +1 +GPU 0 +GPU-5a1c0b3e\.\.\. ISOLATED$'
  expect '^after: gpufence-runtime +ds-1 +GPU 1 +denied / denied +OPEN / OPEN +1 +GPU 1 +GPU-c3e79d42\.\.\. ISOLATED$'
  expect '^  - \[gpu.shared\] 2 containers .* use GPU 0'
  expect '^  - \[gpu.process-on-unallocated\] container video/before-1/deepstream'
  expect '^gpufence doctor, after \(exit 0\):'
fi
expect 'event=plugin.allocate resource=nvidia.com/gpu'
after_dirs=$(ls -d /tmp/gpufence-demo-* 2>/dev/null | wc -l)
[ "$after_dirs" -le "$before_dirs" ] || { echo "FAIL: demo left a temp dir behind"; fail=1; }
pgrep -f 'gpufence-device-plugin --plugin-dir /tmp/gpufence-demo' >/dev/null && { echo "FAIL: plugin still running"; fail=1; }
pgrep -f '/tmp/gpufence-demo-' >/dev/null && { echo "FAIL: processes of the demo still run:"; pgrep -af '/tmp/gpufence-demo-'; fail=1; }
exit $fail
