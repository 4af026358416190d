#!/usr/bin/env bash
# make demo through containerd's CRI (scripts/demo.sh runs this first): the seed's node, simulated
# — two RTX 3080s (mock NVML, fake /dev/nvidia0..1), the system's containerd set up as a user
# would (`containerd config default`, `gpufence setup containerd`), gpufence-device-plugin
# registered with a stand-in kubelet that runs two DeepStream pods (nvidia.com/gpu: 1 each,
# privileged as the seed's) through the CRI. First the seed's way: the default runc handler, the
# allocation in NVIDIA_VISIBLE_DEVICES only, deepstream-app run directly. Then the gpufence way:
# the gpufence handler, the plugin's default strategies, `gpufence launch`. Each pod tries to open
# both GPUs (a fake node answers ENXIO when the cgroup lets the open through, EPERM when it denies
# it, ENOENT when the node is not there), lists the GPUs it sees (an nvidia-smi -L stand-in), and
# the host lists which GPU each app runs on (`gpufence list`) and asks `gpufence doctor`.
# Exits 77 after a "SKIP: why" line when containerd cannot run here (scripts/demo.sh then runs
# the runc-only demo). docs/containerd-lines.md has the details of the simulated node.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=1.6  # the system's containerd: Debian 12's (scripts/install-deps.sh installs it)
GF_CRI_WORK_PREFIX=gpufence-demo
GF_CRI_QUIET=1
echo "== make demo through containerd's CRI (the system's containerd; docs/containerd-lines.md) =="
# It prints the versions it runs, or a "SKIP: why" line and exits 77.
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034
. "$src/scripts/lib/cri_node.sh"
# shellcheck source=scripts/lib/seed_pods.sh
. "$src/scripts/lib/seed_pods.sh"

echo "== The simulated node (gpufence list) =="
host_gpufence list
echo
echo "   containerd's config: 'containerd config default', then 'gpufence setup containerd' (handler 'gpufence')"
echo
echo "== Running two DeepStream pods (nvidia.com/gpu: 1 each, privileged) through containerd's CRI =="
look_exec="$probe; $seed_exec"
echo "   before: handler runc, the allocation only in NVIDIA_VISIBLE_DEVICES, deepstream-app itself"
: > "$work/acct/processes"
RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$look_exec RUN_WHILE=look \
  RUN_PLUGIN_ARGS="--device-list-strategy envvar --no-cuda-visible-devices" \
  run_pods before runc 2 --privileged "${seed_pod[@]}" "${host_dev[@]}" --shell "$(seed_shell "$seed_app")"
echo "   after:  handler gpufence (gpufence-runtime), the plugin's defaults, gpufence launch"
: > "$work/acct/processes"
RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$look_exec RUN_WHILE=look \
  run_pods after gpufence 2 --privileged "${seed_pod[@]}" "${host_dev[@]}" --shell "$(seed_shell "$launch")"
for name in before after; do
  [ "$(cat "$work/$name.rc")" = 0 ] || {
    echo "the '$name' pods did not run:" >&2
    sed 's/^/  /' "$work/$name.out" >&2
    exit 1
  }
done

# What a probe line means for a user.
verdict() {
  case $1 in
    ENXIO | OK) echo "OPEN" ;;
    EPERM | MKNOD_EPERM) echo "denied" ;;
    ENOENT) echo "absent" ;;
    *) echo "${1:-?}" ;;
  esac
}
cvd_of() { awk -v p="$2" '$1=="pod" && $2==p && $3=="exec" && $4 ~ /^CVD=/ {sub(/^CVD=/, "", $4); print $4}' "$work/$1.out"; }
fmt='%-27s %-6s %-6s %-16s %-16s %-5s %-7s %-15s %s\n'
row() {  # row NAME LABEL POD
  local name=$1 p=$3 own other uuid app cvd on result
  own=$(gpu_of "$name" "$p"); other=$((1 - ${own/\?/0}))
  uuid=${GPU[${own/\?/0}]}
  app=$(app_says "$name" "$p")
  on="?"; [ "$app" = "${GPU[0]}" ] && on="GPU 0"; [ "$app" = "${GPU[1]}" ] && on="GPU 1"
  cvd=$(cvd_of "$name" "$p")
  result="ISOLATED"
  [ "$(result "$name" "$p" "/dev/nvidia$other")" = ENXIO ] || [ "$(result "$name" "$p" "/tmp/n$other")" = ENXIO ] &&
    result="LEAK: reaches GPU $other"
  [ "$app" = "$uuid" ] || result="$result, runs on $on"
  # shellcheck disable=SC2059
  printf "$fmt" "$2" "ds-$p" "GPU $own" \
    "$(verdict "$(result "$name" "$p" /dev/nvidia0)") / $(verdict "$(result "$name" "$p" /tmp/n0)")" \
    "$(verdict "$(result "$name" "$p" /dev/nvidia1)") / $(verdict "$(result "$name" "$p" /tmp/n1)")" \
    "$(smi_lines "$name" "$p")" "$on" "${cvd:+${cvd:0:12}...}" "$result"
}
echo
# shellcheck disable=SC2059
printf "$fmt" "" "pod" "alloc" "/dev/nvidia0" "/dev/nvidia1" "sees" "app on" "CUDA_VIS" "result"
# shellcheck disable=SC2059
printf "$fmt" "" "" "" "(node / mknod)" "(node / mknod)" "GPUs" "" "" ""
for p in 0 1; do row before "before: runc (seed's node)" "$p"; done
for p in 0 1; do row after "after: gpufence-runtime" "$p"; done
echo
echo "Before: both pods can open both GPUs (privileged = every host device, and the env variable"
echo "filters nothing), each sees both, and CUDA_VISIBLE_DEVICES is unset, so both apps take GPU 0:"
echo "the seed's 'every process runs on GPU 0'."
echo "After: each pod opens only its own GPU (the other is denied by the devices cgroup even if the"
echo "pod makes the node itself), sees only that one, and its app runs on it."
echo
for name in before after; do
  echo "gpufence list on the host, $name:"
  grep -E '^GPU |^    process |processes: none' "$work/$name.list" | sed 's/^/  /'
done
echo
echo "gpufence doctor, before (exit $(cat "$work/before.doctor-rc")):"
grep -E '^- \[' "$work/before.doctor" | sed 's/^/  /'
echo "gpufence doctor, after (exit $(cat "$work/after.doctor-rc")):"
grep -E '^- \[' "$work/after.doctor" | sed 's/^/  /' | grep . || echo "  no findings"
echo
echo "gpufence-device-plugin's allocations (after):"
grep 'event=plugin.allocate ' "$work/device-plugin-after.log" | sed 's/^/  /'
echo "gpufence-runtime's decisions (after):"
grep 'event=runtime.decision' "$work/after.decisions" | grep -v 'channel=none' | sed 's/^/  /'
