#!/usr/bin/env bash
# make demo: the seed's node, simulated, broken and then fixed. Through containerd's CRI when it
# runs here (scripts/demo_cri.sh); otherwise, below, with runc alone:
#
# Two RTX 3080s (mock NVML + fake /dev/nvidia0, /dev/nvidia1), two "DeepStream" containers each
# allocated one GPU. First as the seed's node ran them: plain runc, privileged, the allocation only
# in NVIDIA_VISIBLE_DEVICES. Then the gpufence way: gpufence-device-plugin registers with a test
# kubelet (no real kubelet can run here), which admits the two containers through
# GetPreferredAllocation and Allocate; the containers get what the Allocate answers carry (mount
# markers, CDI annotation, env) and are started through gpufence-runtime. Each container tries to
# open both GPUs; a fake node with no driver behind it answers ENXIO when the cgroup lets the open
# through, EPERM when it denies it, ENOENT when the node is not there.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
. "$here/scripts/lib/bundle.sh"

if [ "$(id -u)" != 0 ]; then
  echo "make demo runs real containers with runc and creates device nodes: run it as root (sudo make demo)." >&2
  exit 1
fi
command -v runc >/dev/null || { echo "runc is missing: run 'make test' once (it installs the packages) or apt-get install runc" >&2; exit 1; }

# Through containerd's CRI when this machine can run it (scripts/demo_cri.sh); otherwise the same
# node with runc alone. GPUFENCE_DEMO_RUNC=1 asks for the runc-only demo.
if [ -z "${GPUFENCE_DEMO_RUNC:-}" ]; then
  # Interrupted, it cleans up before this script ends (bash runs the trap once it has finished).
  trap 'interrupted=1' INT TERM
  interrupted=""
  bash "$here/scripts/demo_cri.sh"
  rc=$?
  [ -z "$interrupted" ] || exit 130
  trap - INT TERM
  [ "$rc" = 77 ] || exit "$rc"
  echo "make demo: containerd cannot run here (the line above says why): the same demo with runc"
  echo "alone, the runtime called as containerd would call it, without containerd's CRI."
  echo
fi

work=$(mktemp -d /tmp/gpufence-demo-XXXXXX)
state=$work/runc-state
ids=()
plugin_pid=""
kubelet_pid=""
cleanup() {
  local id
  [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null && wait "$kubelet_pid" 2>/dev/null
  [ -n "$plugin_pid" ] && kill "$plugin_pid" 2>/dev/null && wait "$plugin_pid" 2>/dev/null
  for id in "${ids[@]}"; do runc --root "$state" delete --force "$id" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export MOCK_NVML_CONFIG=$here/tools/mock-nvml/examples/two-rtx3080.json
export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)

node=$work/node
gf_make_node_root "$node"
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/gpufence-runtime.log"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml

echo "== The simulated node (gpufence list) =="
"$build/bin/gpufence" list
echo

echo "== gpufence-device-plugin registers; the test kubelet admits two pods (nvidia.com/gpu: 1 each) =="
# The kubelet first, the plugin once kubelet.sock is there, as on a node: the kubelet deletes every
# socket in the directory when it starts, so a plugin started earlier would be cut off.
mkdir -p "$work/device-plugins"
"$build/bin/gpufence-test-kubelet" --plugin-dir "$work/device-plugins" --admit 2 > "$work/allocations" &
kubelet_pid=$!
for _ in $(seq 200); do [ -S "$work/device-plugins/kubelet.sock" ] && break; sleep 0.05; done
"$build/bin/gpufence-device-plugin" --plugin-dir "$work/device-plugins" --host-root "$node" \
  --dev-root "$node" --cdi-spec-dir "$work/cdi" --log-file "$work/device-plugin.log" &
plugin_pid=$!
wait "$kubelet_pid" || { echo "the test kubelet could not admit the pods" >&2; exit 1; }
kubelet_pid=""
for i in 0 1; do
  echo "  ds-$i: allocated $(awk -v i=$i '$1==i && $2=="ids" {print $3}' "$work/allocations")" \
       "(mount marker, CDI annotation, CUDA_VISIBLE_DEVICES)"
done
echo

probe='["/bin/sh","-c","gpufence-probe /dev/nvidia0 /dev/nvidia1; if mknod /tmp/n0 c 195 0 2>/dev/null; then gpufence-probe /tmp/n0; else echo /tmp/n0 MKNOD_EPERM; fi; if mknod /tmp/n1 c 195 1 2>/dev/null; then gpufence-probe /tmp/n1; else echo /tmp/n1 MKNOD_EPERM; fi; echo CVD=$CUDA_VISIBLE_DEVICES"]'

# What a probe line means for a user.
verdict() {
  case $1 in
    ENXIO|OK) echo "OPEN" ;;
    EPERM|MKNOD_EPERM) echo "denied" ;;
    ENOENT) echo "absent" ;;
    *) echo "$1" ;;
  esac
}

# run_case LABEL RUNTIME INDEX: one DeepStream-like container allocated GPU INDEX.
rows=()
run_case() {
  local label=$1 runtime=$2 i=$3 b=$work/$1-ds$3 id="demo-$1-ds$3" out
  mkdir -p "$b"
  gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
  if [ "$label" = before ]; then
    # The seed: NVIDIA's plugin put the UUID in the env; the pod is privileged.
    gf_write_spec "$b" privileged "$probe" "\"NVIDIA_VISIBLE_DEVICES=${GPU[$i]}\"" "" "" "$node"
  else
    # gpufence: what the kubelet put in the container from the plugin's Allocate answer. The pod
    # is still privileged and its image still says NVIDIA_VISIBLE_DEVICES=all (overridden by the
    # plugin's env, as containerd merges it).
    local mounts="" annotations="" env="" key f_kind f_a
    while read -r _ f_kind f_a _; do
      case $f_kind in
        mount) mounts+="${mounts:+,}$(gf_marker_mount "${f_a##*/}")" ;;
        annotation) key=${f_a%%=*}; annotations+="${annotations:+,}\"$key\":\"${f_a#*=}\"" ;;
        env) env+="${env:+,}\"$f_a\"" ;;
      esac
    done < <(awk -v i="$i" '$1==i' "$work/allocations")
    gf_write_spec "$b" privileged "$probe" "$env" "$mounts" "$annotations" "$node"
  fi
  ids+=("$id")
  out=$("$runtime" --root "$state" run --bundle "$b" "$id" 2>&1)
  local g0 g1 c0 c1 cvd
  g0=$(awk '$1=="/dev/nvidia0"{print $2}' <<<"$out"); g1=$(awk '$1=="/dev/nvidia1"{print $2}' <<<"$out")
  c0=$(awk '$1=="/tmp/n0"{print $2}' <<<"$out"); c1=$(awk '$1=="/tmp/n1"{print $2}' <<<"$out")
  cvd=$(sed -n 's/^CVD=//p' <<<"$out")
  local other=$((1 - i)) reach_other
  if [ "$other" = 0 ]; then reach_other="$g0/$c0"; else reach_other="$g1/$c1"; fi
  local result="ISOLATED"
  [[ $reach_other == *ENXIO* ]] && result="LEAK: reaches GPU $other"
  local alloc="GPU $i"
  if [ "$label" = after ]; then
    local uuid; uuid=$(awk -v i="$i" '$1==i && $2=="ids" {print $3}' "$work/allocations")
    [ "$uuid" = "${GPU[0]}" ] && alloc="GPU 0" || alloc="GPU 1"
    other=$([ "$alloc" = "GPU 0" ] && echo 1 || echo 0)
    if [ "$other" = 0 ]; then reach_other="$g0/$c0"; else reach_other="$g1/$c1"; fi
    result="ISOLATED"; [[ $reach_other == *ENXIO* ]] && result="LEAK: reaches GPU $other"
  fi
  rows+=("$(printf '%-30s %-6s %-7s %-16s %-16s %-15s %s' \
    "$( [ "$label" = before ] && echo "before: runc (seed's node)" || echo "after: gpufence-runtime")" \
    "ds-$i" "$alloc" "$(verdict "$g0") / $(verdict "$c0")" "$(verdict "$g1") / $(verdict "$c1")" \
    "${cvd:+${cvd:0:12}...}" "$result")")
}

echo "== Running two DeepStream containers, each allocated one GPU =="
for i in 0 1; do run_case before runc "$i"; done
for i in 0 1; do run_case after "$build/bin/gpufence-runtime" "$i"; done

echo
printf '%-30s %-6s %-7s %-16s %-16s %-15s %s\n' "" "pod" "alloc" "/dev/nvidia0" "/dev/nvidia1" "CUDA_VIS" "result"
printf '%-30s %-6s %-7s %-16s %-16s %-15s %s\n' "" "" "" "(node / mknod)" "(node / mknod)" "" ""
for r in "${rows[@]}"; do echo "$r"; done
echo
echo "Before: both containers can open both GPUs (privileged = every host device, and the env"
echo "variable filters nothing), and CUDA_VISIBLE_DEVICES is unset, so CUDA picks GPU 0 in both:"
echo "the seed's 'every process runs on GPU 0'."
echo "After: each container holds only its own GPU node, the other is denied by the devices cgroup"
echo "even if the container makes the node itself, and CUDA_VISIBLE_DEVICES names its UUID."
echo
echo "gpufence-device-plugin's allocations:"
grep 'event=plugin.allocate ' "$work/device-plugin.log" | sed 's/^/  /'
echo "gpufence-runtime's decisions:"
sed 's/^/  /' "$work/gpufence-runtime.log"
