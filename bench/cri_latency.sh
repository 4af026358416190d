#!/usr/bin/env bash
# Pod create-to-running through containerd's CRI, per containerd line: RunPodSandbox ->
# CreateContainer -> StartContainer -> RUNNING, as gpufence-test-cri measures it ("pod 0 running
# <s>"), for one unprivileged pod allocated one GPU by the real device plugin, through the
# gpufence handler (containerd-shim-runc-v2 -> gpufence-runtime -> runc) and through the plain
# runc handler, interleaved (gpufence, runc, gpufence, ...). Medians. Results: bench/RESULTS.md.
# Usage: bench/cri_latency.sh [ROUNDS] [LINE...]     (default 15 rounds; lines 1.6 1.7 2)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/.." && pwd)}
build=${GPUFENCE_BUILD_DIR:-$src/build}
rounds=${1:-15}
shift $(($# > 0 ? 1 : 0))
lines=("$@")
[ ${#lines[@]} -gt 0 ] || lines=(1.6 1.7 2)

median() { sort -n | awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

printf '| containerd | plain runc handler | gpufence handler | added | ratio |\n|---|---|---|---|---|\n'
for line in "${lines[@]}"; do
  (
    export GF_CRI_QUIET=1
    . "$src/scripts/lib/cri_node.sh" > "/tmp/gpufence-cri-bench-$line.log" 2>&1
    for i in $(seq "$rounds"); do
      for h in gpufence runc; do
        run_pods "$h-$i" "$h" 1
        awk '$1=="pod" && $3=="running" {print $4 * 1000}' "$work/$h-$i.out" >> "$work/$h.ms"
        grep -q ' error ' "$work/$h-$i.out" && { echo "$line $h round $i failed:"; cat "$work/$h-$i.out"; }
      done
    done
    g=$(median < "$work/gpufence.ms"); r=$(median < "$work/runc.ms")
    version=$("$bin/containerd" --version | awk '{print $3}')
    awk -v v="$version" -v g="$g" -v r="$r" -v n="$(wc -l < "$work/gpufence.ms")" \
      'BEGIN {printf "| %s (n=%d) | %.1f ms | %.1f ms | %.1f ms | %.3f |\n", v, n, r, g, g - r, g / r}'
  )
  rc=$?
  [ "$rc" = 77 ] && echo "| $line | skipped: $(grep SKIP "/tmp/gpufence-cri-bench-$line.log") | | | |"
  rm -f "/tmp/gpufence-cri-bench-$line.log"
done
