#!/usr/bin/env bash
# Container create-to-exit time, plain runc vs gpufence-runtime with a GPU allocated, interleaved
# in one run (so machine noise hits both alike). Each run starts from the same pristine
# config.json: an unprivileged container with a mount marker for GPU 1 on the simulated node.
# Usage: bench/shim_vs_runc.sh [RUNS] [tmpfs|disk]   (needs root and runc)
#   tmpfs (default): the bundle lives on tmpfs, as containerd's do (/run/containerd/...);
#   disk: the bundle lives on the root filesystem, where the shim's fsyncs cost real time.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
. "$here/scripts/lib/bundle.sh"
runs=${1:-30}
where=${2:-tmpfs}
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/gpufence-bench-XXXXXX)
trap 'umount "$work" 2>/dev/null; rm -rf "$work"' EXIT
if [ "$where" = tmpfs ]; then mount -t tmpfs -o size=256m gpufence-bench "$work"; fi
node=$work/node
gf_make_node_root "$node"
export MOCK_NVML_CONFIG=$here/tools/mock-nvml/examples/two-rtx3080.json
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
b=$work/bundle
mkdir -p "$b"
gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
gf_write_spec "$b" unprivileged '["/bin/true"]' "" "$(gf_marker_mount GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2)" "" "$node"
cp "$b/config.json" "$work/pristine.json"
# The baseline gets the spec the shim produces (GPU node, cgroup allow, env), which is what the
# kubelet's device specs would give plain runc: both sides then start the same container, and the
# difference is the shim alone. The edited spec is made once with /bin/true as the low-level runtime.
sed 's|^\[log\]|[runtime]\nlow_level = "/bin/true"\n[log]|' "$work/runtime.toml" > "$work/edit-only.toml"
GPUFENCE_RUNTIME_CONFIG=$work/edit-only.toml "$build/bin/gpufence-runtime" create --bundle "$b" edit-only
cp "$b/config.json" "$work/edited.json"
cmp -s "$work/edited.json" "$work/pristine.json" && { echo "the shim did not edit the spec" >&2; exit 1; }

time_run() {  # prints microseconds for one create-to-exit
  if [ "$1" = runc ]; then cp "$work/edited.json" "$b/config.json"; else cp "$work/pristine.json" "$b/config.json"; fi
  local t0=$EPOCHREALTIME
  "$1" --root "$work/state" run --bundle "$b" "bench-$2" >/dev/null
  local t1=$EPOCHREALTIME
  echo $(( (${t1/./} - ${t0/./}) ))
}

# Warm the page cache and the binaries once each.
time_run runc warm-a >/dev/null; time_run "$build/bin/gpufence-runtime" warm-b >/dev/null
runc_us=(); shim_us=()
for i in $(seq "$runs"); do
  runc_us+=("$(time_run runc "r$i")")
  shim_us+=("$(time_run "$build/bin/gpufence-runtime" "s$i")")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mr=$(median "${runc_us[@]}"); ms=$(median "${shim_us[@]}")
echo "bundle on:                  $where"
echo "runs per side:              $runs (interleaved)"
echo "plain runc median:          $(awk -v v="$mr" 'BEGIN{printf "%.2f ms", v/1000}')"
echo "gpufence-runtime median:    $(awk -v v="$ms" 'BEGIN{printf "%.2f ms", v/1000}')"
echo "added by gpufence-runtime:  $(awk -v a="$ms" -v b="$mr" 'BEGIN{printf "%.2f ms (ratio %.3f)", (a-b)/1000, a/b}')"

# Where the added time goes: the same three steps with /bin/true as the low-level runtime, so
# runc's own cost drops out. true = fork+exec floor of this machine; shim pass-through = one more
# exec plus reading runtime.toml; shim create = that plus the spec edit, NVML and the atomic write.
floor_us=(); pass_us=(); edit_us=()
for i in $(seq "$runs"); do
  cp "$work/pristine.json" "$b/config.json"
  t0=$EPOCHREALTIME; /bin/true; t1=$EPOCHREALTIME; floor_us+=($(( ${t1/./} - ${t0/./} )))
  t0=$EPOCHREALTIME; GPUFENCE_RUNTIME_CONFIG=$work/edit-only.toml "$build/bin/gpufence-runtime" state x; t1=$EPOCHREALTIME
  pass_us+=($(( ${t1/./} - ${t0/./} )))
  t0=$EPOCHREALTIME; GPUFENCE_RUNTIME_CONFIG=$work/edit-only.toml "$build/bin/gpufence-runtime" create --bundle "$b" x; t1=$EPOCHREALTIME
  edit_us+=($(( ${t1/./} - ${t0/./} )))
done
ms() { awk -v v="$1" 'BEGIN{printf "%.2f ms", v/1000}'; }
echo "breakdown (low-level runtime = /bin/true, medians):"
echo "  /bin/true alone:             $(ms "$(median "${floor_us[@]}")")"
echo "  shim pass-through (state):   $(ms "$(median "${pass_us[@]}")")"
echo "  shim create with GPU edit:   $(ms "$(median "${edit_us[@]}")")"
grep -q "granted=GPU-c3e79d42" "$work/runtime.log" || { echo "shim did not grant the GPU: benchmark invalid" >&2; exit 1; }
