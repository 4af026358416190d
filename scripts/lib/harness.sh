# The scenario harness every test script sources (and scripts/lib/cri_node.sh, for the demo and
# the benchmarks): `skip REASON` (exit 77: CTest shows it skipped, with the reason printed),
# `check DESCRIPTION COMMAND...` (one line per promise, failures counted), `gf_work_dir PREFIX` (a
# fresh private directory under $TMPDIR, default /tmp). Sourcing it again keeps the count.
# shellcheck shell=bash
skip() { echo "SKIP: $*"; exit 77; }
failures=${failures:-0}
check() { if "${@:2}"; then echo "ok   - $1"; else echo "FAIL - $1"; failures=$((failures + 1)); fi; }
gf_work_dir() { mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX"; }
