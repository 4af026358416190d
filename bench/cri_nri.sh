#!/usr/bin/env bash
# Pod create-to-running through containerd's CRI (line 2.3 by default: NRI v0.12), one GPU pod
# allocated by the real device plugin, as gpufence-test-cri measures it ("pod 0 running <s>":
# RunPodSandbox -> CreateContainer -> StartContainer -> RUNNING), interleaved per round:
#   plain  no runtimeClassName, no NRI plugin connected (runc alone)
#   nri    no runtimeClassName, gpufence-nri connected (the decision inside CreateContainer)
#   shim   the gpufence RuntimeClass handler (gpufence-runtime before runc), no NRI plugin
# unprivileged, then privileged. Medians with the run count, gpufence-nri's own time per
# CreateContainer (took_us in its decision lines) and its RSS at the end. bench/RESULTS.md.
# Usage: bench/cri_nri.sh [ROUNDS] [LINE]     (default 15 rounds, line 2.3)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/.." && pwd)}
build=${GPUFENCE_BUILD_DIR:-$src/build}
rounds=${1:-15}
line=${2:-2.3}
GF_CRI_NRI=1 GF_CRI_QUIET=1 GF_CRI_WORK_PREFIX=gpufence-cri-nri-bench
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh" > /dev/null
median() { sort -n | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
sed "s|^file = .*|file = \"$work/nri.log\"|" "$work/runtime.toml" > "$work/nri.toml"
nri_pid=""
start_nri() {
  local before; before=$(grep -c nri.synchronized "$work/nri.log" 2>/dev/null); before=${before:-0}
  GPUFENCE_RUNTIME_CONFIG=$work/nri.toml "$build/bin/gpufence-nri" --socket "$work/nri/nri.sock" \
    --hook-binary "$build/bin/gpufence-runtime" 2>/dev/null &
  nri_pid=$!
  for _ in $(seq 100); do
    n=$(grep -c nri.synchronized "$work/nri.log" 2>/dev/null)
    [ "${n:-0}" -gt "$before" ] && return; sleep 0.02
  done
}
stop_nri() { [ -n "$nri_pid" ] && kill "$nri_pid" 2>/dev/null && wait "$nri_pid" 2>/dev/null; nri_pid=""; }
trap 'stop_nri; cleanup' EXIT
version=$("$bin/containerd" --version | awk '{print $3}')
echo "containerd $version, runc $(runc --version | awk 'NR==1 {print $3}'), $rounds rounds"
printf '| containerd | pod | plain runc | gpufence-nri | added by NRI | gpufence-runtime handler | added by the shim |\n|---|---|---|---|---|---|---|\n'
for mode in unprivileged privileged; do
  flags=(); [ "$mode" = privileged ] && flags=(--privileged)
  for i in $(seq "$rounds"); do
    for how in plain nri shim; do
      handler=""; [ "$how" = shim ] && handler=gpufence
      [ "$how" = nri ] && start_nri
      run_pods "$mode-$how-$i" "$handler" 1 "${flags[@]}"
      [ "$how" = nri ] && stop_nri
      awk '$1=="pod" && $3=="running" {print $4 * 1000}' "$work/$mode-$how-$i.out" >> "$work/$mode-$how.ms"
      grep -q ' error ' "$work/$mode-$how-$i.out" && { echo "$mode $how round $i failed:"; cat "$work/$mode-$how-$i.out"; }
    done
  done
  p=$(median < "$work/$mode-plain.ms"); n=$(median < "$work/$mode-nri.ms"); s=$(median < "$work/$mode-shim.ms")
  awk -v v="$version" -v m="$mode" -v p="$p" -v n="$n" -v s="$s" -v c="$(wc -l < "$work/$mode-nri.ms")" \
    'BEGIN {printf "| %s (n=%d each) | %s | %.1f ms | %.1f ms | %+.1f ms | %.1f ms | %+.1f ms |\n", v, c, m, p, n, n - p, s, s - p}'
done
grep -o 'took_us=[0-9]*' "$work/nri.log" | cut -d= -f2 > "$work/took.us"
echo "gpufence-nri's own time per CreateContainer, a fresh process each round (its first decision): median $(median < "$work/took.us") us, max $(sort -n "$work/took.us" | tail -1) us (n=$(wc -l < "$work/took.us"))"
# A long-lived plugin, as deployed: 20 pods in a row, then its own time per decision and its RSS.
start_nri
for i in $(seq 20); do run_pods "warm-$i" "" 1; done
grep -o 'took_us=[0-9]*' "$work/nri.log" | tail -20 | cut -d= -f2 > "$work/warm.us"
echo "gpufence-nri's own time per CreateContainer, one process for 20 pods: median $(median < "$work/warm.us") us (n=20); RSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$nri_pid/status")"
