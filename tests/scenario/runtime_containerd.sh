#!/usr/bin/env bash
# gpufence-runtime behind a real containerd: ctr -> containerd (Debian's 1.6) ->
# containerd-shim-runc-v2 -> gpufence-runtime (the shim's BinaryName) -> runc. That is the path a
# RuntimeClass handler takes; here the task API drives it (no kubelet can be installed; the CRI
# path is the same shim and runtime). It checks that a GPU from the device list is isolated and
# that a refusal reaches the user in containerd's own error, which containerd reads from the
# --log file it passes, not from the runtime's stderr.
# Usage: runtime_containerd.sh CASE
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
. "$src/scripts/lib/bundle.sh"
[ "$(id -u)" = 0 ] || skip "needs root to run containerd and mknod"
command -v containerd >/dev/null || skip "containerd is not installed (apt-get install containerd)"
command -v ctr >/dev/null || skip "ctr is not installed"
command -v runc >/dev/null || skip "runc is not installed"
why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"

work=$(gf_work_dir gpufence-rtc)
pid=""
sock=$work/containerd.sock
cleanup() {
  ctr --address "$sock" -n gpufence task kill -s KILL iso1 >/dev/null 2>&1
  for c in iso1 ref1; do ctr --address "$sock" -n gpufence container rm "$c" >/dev/null 2>&1; done
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  umount -R "$work/root" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

node=$work/node
gf_make_node_root "$node"
mknod -m 666 "$node/dev/nvidia7" c 195 7  # a GPU minor this node has no GPU for
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" \
  "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml MOCK_NVML_CONFIG=$src/tools/mock-nvml/examples/two-rtx3080.json
printf 'version = 2\nroot = "%s/root"\nstate = "%s/state"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s"\n' \
  "$work" "$work" "$sock" > "$work/config.toml"
containerd --config "$work/config.toml" > "$work/containerd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do ctr --address "$sock" version >/dev/null 2>&1 && break; sleep 0.1; done
ctr --address "$sock" version >/dev/null 2>&1 || skip "this machine cannot run containerd: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"
echo "containerd $(containerd --version | awk '{print $3}'), $(runc --version | head -1)"

rootfs=$work/rootfs
gf_make_rootfs "$rootfs" "$build/bin/gpufence-probe"
shim=$build/bin/gpufence-runtime
ctr_run() { ctr --address "$sock" -n gpufence run --rm --rootfs --runc-binary "$shim" "$@"; }

case ${1:?usage: runtime_containerd.sh CASE} in  # gf:cases
  device-isolated)
    # --device adds the node to linux.devices and the cgroup, as the kubelet's DeviceSpecs do.
    out=$(ctr_run --device "$node/dev/nvidia1" "$rootfs" iso1 \
      /bin/sh -c 'gpufence-probe /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl; echo NVD=$NVIDIA_VISIBLE_DEVICES' 2>&1)
    check "GPU 1 opens" grep -qx "/dev/nvidia1 ENXIO" <<<"$out"
    check "GPU 0 is absent" grep -qx "/dev/nvidia0 ENOENT" <<<"$out"
    check "the control node is there" grep -qx "/dev/nvidiactl ENXIO" <<<"$out"
    check "env names GPU 1" grep -qx "NVD=$(gf_gpu_uuids | sed -n 2p)" <<<"$out"
    check "the shim decided from the device specs" grep -q "container=iso1 .*channel=device-specs" "$work/runtime.log"
    [ "$failures" -eq 0 ] || echo "$out"
    ;;
  refusal-shown)
    out=$(ctr_run --device "$node/dev/nvidia7" "$rootfs" ref1 /bin/true 2>&1)
    rc=$?
    check "the task was not created" test "$rc" -ne 0
    check "containerd's error names gpufence's reason" grep -q "OCI runtime create failed: gpufence-runtime: refusing to create container ref1: device spec /dev/nvidia7 (195:7) names no GPU of this node" <<<"$out"
    check "not containerd's 'unable to retrieve OCI runtime error'" bash -c "! grep -q 'unable to retrieve OCI runtime error' <<<'$out'"
    echo "  containerd said: $out"
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed"; tail -20 "$work/containerd.log"; exit 1; }
