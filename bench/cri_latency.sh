#!/usr/bin/env bash
# Pod create-to-running through containerd's CRI, per containerd line: RunPodSandbox ->
# CreateContainer -> StartContainer -> RUNNING, as gpufence-test-cri measures it ("pod 0 running
# <s>"), for one pod (unprivileged, then privileged) allocated one GPU by the real device plugin, through the
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

printf '| containerd | pod | plain runc handler | gpufence handler | added | ratio |\n|---|---|---|---|---|---|\n'
for line in "${lines[@]}"; do
  (
    export GF_CRI_QUIET=1
    . "$src/scripts/lib/cri_node.sh" > "/tmp/gpufence-cri-bench-$line.log" 2>&1
    version=$("$bin/containerd" --version | awk '{print $3}')
    # unprivileged, and privileged as the seed's pods (gpufence-runtime then also rewrites the
    # devices cgroup as a whitelist).
    for mode in unprivileged privileged; do
      flags=(); [ "$mode" = privileged ] && flags=(--privileged)
      for i in $(seq "$rounds"); do
        for h in gpufence runc; do
          run_pods "$mode-$h-$i" "$h" 1 "${flags[@]}"
          awk '$1=="pod" && $3=="running" {print $4 * 1000}' "$work/$mode-$h-$i.out" >> "$work/$mode-$h.ms"
          grep -q ' error ' "$work/$mode-$h-$i.out" && { echo "$line $mode $h round $i failed:"; cat "$work/$mode-$h-$i.out"; }
        done
      done
      g=$(median < "$work/$mode-gpufence.ms"); r=$(median < "$work/$mode-runc.ms")
      awk -v v="$version" -v m="$mode" -v g="$g" -v r="$r" -v n="$(wc -l < "$work/$mode-gpufence.ms")" \
        'BEGIN {printf "| %s (n=%d) | %s | %.1f ms | %.1f ms | %.1f ms | %.3f |\n", v, n, m, r, g, g - r, g / r}'
    done
  )
  rc=$?
  [ "$rc" = 77 ] && echo "| $line | skipped: $(grep SKIP "/tmp/gpufence-cri-bench-$line.log") | | | | |"
  rm -f "/tmp/gpufence-cri-bench-$line.log"
done
