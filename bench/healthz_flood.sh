#!/usr/bin/env bash
# /healthz latency and success under a flood of the metrics port, before and after /healthz got a
# listener of its own. Compiles bench/healthz_flood.cpp against the current
# src/common/http_server.cpp and, for the "before" side, against deviceplugin/metrics.cpp of BEFORE
# (a git commit, default 04417a7: one listener for both, as the plugin and `install --watch` served
# them). Only the listener and src/common are compiled, so it needs no gRPC build.
# Usage: bench/healthz_flood.sh [PROBES]   (IDLE/SLOW pairs: FLOODS="0:0 200:0 0:50 200:50")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
probes=${1:-100}
before=${BEFORE:-04417a7}
floods=${FLOODS:-"0:0 200:0 0:50 200:50"}
work=$(mktemp -d /tmp/gpufence-flood-XXXXXX)
trap 'rm -rf "$work"' EXIT
cxx=${CXX:-g++}
flags=(-std=c++23 -O2 -pthread)
common=("$here/src/common/error.cpp" "$here/src/common/strings.cpp")
"$cxx" -I"$here/src" "${flags[@]}" -DGPUFENCE_HTTP_SERVER -o "$work/now" "$here/bench/healthz_flood.cpp" \
  "$here/src/common/http_server.cpp" "${common[@]}"
mkdir -p "$work/old/deviceplugin"
git -C "$here" show "$before:src/deviceplugin/metrics.hpp" > "$work/old/deviceplugin/metrics.hpp"
git -C "$here" show "$before:src/deviceplugin/metrics.cpp" > "$work/old/deviceplugin/metrics.cpp"
# The older header first, so both the bench and the older metrics.cpp include it.
"$cxx" -I"$work/old" -I"$here/src" "${flags[@]}" -o "$work/before" "$here/bench/healthz_flood.cpp" \
  "$work/old/deviceplugin/metrics.cpp" "${common[@]}"
for f in $floods; do
  idle=${f%:*} slow=${f#*:}
  echo "before ($before), $("$work/before" shared "$idle" "$slow" "$probes")"
  echo "now,              $("$work/now" shared "$idle" "$slow" "$probes")"
  echo "now,              $("$work/now" split "$idle" "$slow" "$probes")"
done
