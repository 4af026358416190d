#!/usr/bin/env bash
# gpufence doctor on a live node: real runc containers (shaped like containerd's: 64-hex ids,
# kubepods cgroup paths, CRI annotations in config.json), the test PodResources server standing in
# for the kubelet, and the mock NVML reporting the containers' real PIDs on the GPUs.
# Usage: doctor.sh seed|fixed
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
. "$src/scripts/lib/bundle.sh"
[ "$(id -u)" = 0 ] || skip "needs root to run runc"
command -v runc >/dev/null || skip "runc is not installed"
[ -d /sys/fs/cgroup/devices ] || skip "needs the cgroup v1 devices controller (this test reads devices.list)"
why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"

work=$(gf_work_dir gpufence-doc)
state=$work/state
ids=(); pr_pid=""
cleanup() {
  [ -n "$pr_pid" ] && kill "$pr_pid" 2>/dev/null
  for id in "${ids[@]}"; do runc --root "$state" delete --force "$id" >/dev/null 2>&1; done
  rmdir /sys/fs/cgroup/*/kubepods/besteffort/pod-ds-?-$$ 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
has() { grep -qE -- "$1" <<<"$2" || { echo "  expected /$1/"; return 1; }; }
hasnt() { ! grep -qE -- "$1" <<<"$2" || { echo "  unexpected /$1/"; return 1; }; }

mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)
GPU0=${GPU[0]} GPU1=${GPU[1]}
node=$work/node
gf_make_node_root "$node"
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
export MOCK_NVML_CONFIG=$src/tools/mock-nvml/examples/two-rtx3080.json

hexid() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# start POD INDEX RUNTIME ENV MOUNTS: a running "DeepStream" container shaped like containerd's.
start() {
  local pod=$1 i=$2 runtime=$3 env=$4 mounts=$5 id b
  id=$(hexid); b=$work/$pod
  mkdir -p "$b"
  gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
  gf_write_spec "$b" privileged '["/bin/sleep","120"]' "$env" "$mounts" \
    "\"io.kubernetes.cri.sandbox-name\":\"$pod\",\"io.kubernetes.cri.sandbox-namespace\":\"video\",\"io.kubernetes.cri.container-name\":\"deepstream\"" "$node"
  # The pod's cgroup is this run's own ($$): cases running in parallel must not see each other.
  sed -i 's|"linux":{|"linux":{"cgroupsPath":"/kubepods/besteffort/pod-'"$pod-$$"'/'"$id"'",|' "$b/config.json"
  ids+=("$id")
  "$runtime" --root "$state" create --bundle "$b" "$id" </dev/null >/dev/null 2>"$work/$pod.err" || { cat "$work/$pod.err"; return 1; }
  "$runtime" --root "$state" start "$id"
  eval "ID_$i=$id"
  eval "PID_$i=$(runc --root "$state" state "$id" | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')"
}

case ${1:?usage: doctor.sh seed|fixed} in  # gf:cases
  seed)
    # The seed's way: plain runc, privileged, allocation only in the env.
    start ds-a 0 runc "\"NVIDIA_VISIBLE_DEVICES=$GPU0\"" ""
    start ds-b 1 runc "\"NVIDIA_VISIBLE_DEVICES=$GPU1\"" ""
    { printf 'version = 2\n'; grep -v '^version' "$src/tests/fixtures/containerd/seed-snippet.toml"; } > "$work/containerd.toml"
    # Every DeepStream process runs on GPU 0.
    gpu0_pids="{\"pid\": $PID_0, \"used_memory\": 536870912}, {\"pid\": $PID_1, \"used_memory\": 536870912}"
    gpu1_pids=""
    ;;
  fixed)
    # gpufence: the plugin's mount marker, started through gpufence-runtime; still privileged.
    start ds-a 0 "$build/bin/gpufence-runtime" '"NVIDIA_VISIBLE_DEVICES=all"' "$(gf_marker_mount $GPU0)"
    start ds-b 1 "$build/bin/gpufence-runtime" '"NVIDIA_VISIBLE_DEVICES=all"' "$(gf_marker_mount $GPU1)"
    : > "$work/containerd.toml"
    "$build/bin/gpufence" setup containerd --config "$work/containerd.toml" --binary "$build/bin/gpufence-runtime" >/dev/null
    gpu0_pids="{\"pid\": $PID_0, \"used_memory\": 536870912}"
    gpu1_pids="{\"pid\": $PID_1, \"used_memory\": 536870912}"
    ;;
esac

cat > "$work/nvml.json" <<JSON
{"driver_version": "550.54.15", "gpus": [
 {"uuid": "$GPU0", "name": "NVIDIA GeForce RTX 3080", "minor": 0, "pci_bus_id": "00000000:01:00.0", "memory_total": 10737418240, "processes": [$gpu0_pids]},
 {"uuid": "$GPU1", "name": "NVIDIA GeForce RTX 3080", "minor": 1, "pci_bus_id": "00000000:02:00.0", "memory_total": 10737418240, "processes": [$gpu1_pids]}]}
JSON
export MOCK_NVML_CONFIG=$work/nvml.json
"$build/bin/gpufence-test-kubelet" --pod-resources "$work/pod-resources.sock" \
  --pod "video/ds-a/deepstream=$GPU0" --pod "video/ds-b/deepstream=$GPU1" --allocatable "$GPU0" --allocatable "$GPU1" &
pr_pid=$!
for _ in $(seq 300); do [ -S "$work/pod-resources.sock" ] && break; sleep 0.1; done

# The probe's temporary nodes go under $TMPDIR: this run's own, so other tests' probes are not
# counted by the check that it left none.
mkdir -p "$work/tmp"
doctor() {
  TMPDIR=$work/tmp "$build/bin/gpufence" doctor --pod-resources-socket "$work/pod-resources.sock" --runc-root "$state" \
    --containerd-config "$work/containerd.toml" "$@"
}
procs_before=$(cat /sys/fs/cgroup/devices/kubepods/besteffort/pod-ds-a-$$/$ID_0/cgroup.procs)
for mode in plain probe; do
  flag=(); [ $mode = probe ] && flag=(--probe)
  out=$(doctor "${flag[@]}"); rc=$?
  echo "---- doctor ${flag[*]} (exit $rc) ----"; echo "$out"
  if [ "$1" = seed ]; then
    check "[$mode] exit 1" test $rc = 1
    check "[$mode] ds-a holds GPU 1 it was not allocated" has "gpu.privileged-open-unallocated\] privileged container video/ds-a/deepstream holds GPU 1" "$out"
    check "[$mode] ds-b holds GPU 0 it was not allocated" has "gpu.privileged-open-unallocated\] privileged container video/ds-b/deepstream holds GPU 0" "$out"
    check "[$mode] ds-b's process runs on GPU 0 (the seed's symptom)" has "gpu.process-on-unallocated\] container video/ds-b/deepstream was allocated GPU 1 .* but its processes run on GPU 0" "$out"
    check "[$mode] two containers share GPU 0" has "gpu.shared\] 2 containers" "$out"
    check "[$mode] the handler is missing in containerd" has "containerd.handler-missing" "$out"
    check "[$mode] the v1.linux table is named" has "containerd.runtime-under-v1-linux" "$out"
    [ $mode = probe ] && check "[probe] reach measured by the probe" has "can open GPU0,GPU1 \(probe\)" "$out"
  else
    check "[$mode] exit 0" test $rc = 0
    # Clean of errors. Privileged containers hold CAP_SYS_PTRACE: that warning (pod.cap-sys-ptrace,
    # docs/trust-model.md "Routes around the devices cgroup") is the only one.
    check "[$mode] no errors" hasnt "ERRORS:" "$out"
    check "[$mode] privileged containers' CAP_SYS_PTRACE is named" has "pod.cap-sys-ptrace\] GPU container video/ds-a/deepstream has CAP_SYS_PTRACE \(privileged\)" "$out"
    check "[$mode] no other finding" hasnt "^- \[([^p]|p[^o]|pod\.[^c])" "$out"
    check "[$mode] ds-a reaches only GPU 0" has "video/ds-a/deepstream \[privileged\]: allocated GPU0 \| can open GPU0 " "$out"
    check "[$mode] ds-b reaches only GPU 1" has "video/ds-b/deepstream \[privileged\]: allocated GPU1 \| can open GPU1 " "$out"
  fi
done
check "the probe left no process in the container's cgroup" test "$procs_before" = "$(cat /sys/fs/cgroup/devices/kubepods/besteffort/pod-ds-a-$$/$ID_0/cgroup.procs)"
check "the probe left no temporary nodes" bash -c "! ls -d '$work'/tmp/gpufence-probe-* 2>/dev/null | grep -q ."
# That check looks where the probe works: with $TMPDIR somewhere it cannot make its directory,
# the probe says so (and the OCI rules decide), so it did work under $work/tmp above.
out=$(TMPDIR=$work/absent "$build/bin/gpufence" doctor --pod-resources-socket "$work/pod-resources.sock" \
  --runc-root "$state" --containerd-config "$work/containerd.toml" --probe 2>&1)
check "the probe works under \$TMPDIR" has "probe of video/ds-a/deepstream: mkdtemp $work/absent/gpufence-probe-" "$out"
if [ "$1" = fixed ]; then
  # containerd settings that undo the allocation channel, seen by the doctor on the live node.
  cp "$work/containerd.toml" "$work/containerd.good"
  sed -i '/runtimes\.nvidia\]$/a\  pod_annotations = ["cdi.k8s.io/*"]' "$work/containerd.toml"
  out=$(doctor); rc=$?
  check "pod_annotations admitting cdi.k8s.io/: exit 1" test $rc = 1
  check "named, with the fix" has "containerd.pod-annotations-cdi\] runtime 'nvidia' copies pod annotations" "$out"
  mkdir -p "$work/cdi"
  { cat "$work/containerd.good"; printf '[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n  cdi_spec_dirs = ["%s/cdi"]\n' "$work"; } > "$work/containerd.toml"
  out=$(doctor)
  check "CDI on without a GPU spec is named" has "containerd.cdi-no-gpu-spec\]" "$out"
  # NVIDIA's kind names none of the plugin's devices; the plugin's own kind does.
  printf 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n' > "$work/cdi/nvidia.yaml"
  out=$(doctor)
  check "NVIDIA's kind alone: still named" has "containerd.cdi-no-gpu-spec\]" "$out"
  rm "$work/cdi/nvidia.yaml"
  "$build/bin/gpufence" cdi generate --kind gpufence.io/gpu --output "$work/cdi/gpufence.yaml" >/dev/null 2>&1 \
    || printf 'cdiVersion: "0.5.0"\nkind: gpufence.io/gpu\ndevices:\n- name: "0"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n' > "$work/cdi/gpufence.yaml"
  out=$(doctor)
  check "with a spec of the plugin's kind it is not" hasnt "containerd.cdi-no-gpu-spec" "$out"
  check "one spec, no duplicate" hasnt "cdi.duplicate-device" "$out"
  cp "$work/cdi/gpufence.yaml" "$work/cdi/operator.yaml"
  out=$(doctor)
  check "two specs of one directory defining the same GPUs are named" has "cdi.duplicate-device\] 2 CDI specs in one directory define the same device\\(s\\).*gpufence.io/gpu=0" "$out"
  check "with both files" has "$work/cdi/gpufence.yaml and $work/cdi/operator.yaml" "$out"
  cp "$work/containerd.good" "$work/containerd.toml"
fi
json=$(doctor --json)
check "JSON report has the schema" has '"schema": "gpufence.doctor/v1"' "$json"
[ "$failures" = 0 ]
