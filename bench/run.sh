#!/usr/bin/env bash
# make bench: every benchmark, side by side with its baseline. Results go in bench/RESULTS.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
echo "== spec edit alone (in-process, Google Benchmark) =="
"$build/bin/bench_spec_edit" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
echo
echo "== gpufence doctor: snapshot + judge, 8 GPUs, 10..220 containers =="
"$build/bin/bench_doctor"
echo
echo "== gpufence-device-plugin: Allocate latency, memory, XID -> Unhealthy =="
"$build/bin/bench_plugin" 10000
echo
echo "== /healthz under a flood of the metrics port: before (one listener) vs now =="
bash "$here/bench/healthz_flood.sh" 100
echo
if [ "$(id -u)" = 0 ] && command -v runc >/dev/null; then
  echo "== container lifecycle as containerd drives it: plain runc vs gpufence-runtime =="
  bash "$here/bench/lifecycle.sh" 30 unprivileged
  echo
  bash "$here/bench/lifecycle.sh" 30 privileged
  echo
  echo "== pod create-to-running through containerd's CRI: plain runc handler vs gpufence =="
  bash "$here/bench/cri_latency.sh" 15
else
  echo "skipping the runc benchmark: needs root and runc"
fi
