#!/usr/bin/env bash
# The seed's final checks 2 and 3 at the runc level, with the mock NVML behaving as
# the driver's does inside a container (docs/mock-nvml.md):
#   mock-visibility  the mock's driver visibility on the host: procfs entry + openable node
#   listing          an nvidia-smi -L stand-in inside the container: one GPU through
#                    gpufence-runtime, both through plain runc privileged
#   accounting       two stand-in deepstream-apps through `gpufence launch`, isolated by
#                    gpufence-runtime: `gpufence list` on the host shows one on each GPU
#   accounting-privileged  the same with the seed's privileged pods (mount markers only)
#   accounting-seed  the seed's setup (plain runc, privileged, NVIDIA_VISIBLE_DEVICES only,
#                    gpu-id=0): both land on GPU 0 and `gpufence doctor` names it
# Usage: seed_checks.sh CASE
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
. "$src/scripts/lib/bundle.sh"

case_name=${1:?usage: seed_checks.sh CASE}
[ "$(id -u)" = 0 ] || skip "needs root to run runc and mknod"
[ -x "$build/bin/gpufence-smi" ] || skip "gpufence-smi is not built ($build/bin)"
if [ "$case_name" != mock-visibility ]; then
  command -v runc >/dev/null || skip "runc is not installed (apt-get install runc)"
  command -v busybox >/dev/null || [ -x /bin/busybox ] || skip "busybox-static is not installed"
  why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"
fi

work=$(gf_work_dir gpufence-seed)
state=$work/state
ids=()
bg_pids=()
cleanup() {
  local id p
  for id in "${ids[@]}"; do runc --root "$state" delete --force "$id" >/dev/null 2>&1; done
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # runc can leave a killed container's (empty) cgroup behind; another doctor run would list it.
  for id in "${ids[@]}"; do rmdir /sys/fs/cgroup/*/kubepods/besteffort/pod-seedchk-*/"$id" 2>/dev/null; done
  rmdir /sys/fs/cgroup/*/kubepods/besteffort/pod-seedchk-* 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

has() { grep -qE -- "$1" <<<"$2" || { echo "  expected /$1/ in:"; sed 's/^/    | /' <<<"$2"; return 1; }; }
hasnt() { ! grep -qE -- "$1" <<<"$2" || { echo "  unexpected /$1/ in:"; sed 's/^/    | /' <<<"$2"; return 1; }; }
count_is() { local n; n=$(grep -cE -- "$2" <<<"$3"); [ "$n" = "$1" ] || { echo "  expected $1 lines /$2/, got $n in:"; sed 's/^/    | /' <<<"$3"; return 1; }; }

mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)
GPU0=${GPU[0]} GPU1=${GPU[1]}
mock=$build/lib/mock-nvml/default/libnvidia-ml.so.1
node=$work/node
gf_make_node_root "$node"
# A stand-in for /proc/driver/nvidia/gpus (no driver here) that containers get bind-mounted and
# the shim's driver-procfs hook narrows, as on a real node.
for bus in 0000:01:00.0 0000:02:00.0; do
  mkdir -p "$node/fakeproc/gpus/$bus"; echo "Bus Location: $bus" > "$node/fakeproc/gpus/$bus/information"
done
mkdir -p "$work/etc-nvml" "$work/acct"
: > "$work/acct/processes"
chmod 666 "$work/acct/processes"
# The node's GPUs, with no preset processes: every process comes from the accounting file.
cat > "$work/etc-nvml/nvml.json" <<JSON
{"driver_version": "550.54.15", "gpus": [
 {"uuid": "$GPU0", "name": "NVIDIA GeForce RTX 3080", "minor": 0, "pci_bus_id": "00000000:01:00.0", "memory_total": 10737418240},
 {"uuid": "$GPU1", "name": "NVIDIA GeForce RTX 3080", "minor": 1, "pci_bus_id": "00000000:02:00.0", "memory_total": 10737418240}]}
JSON
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" "$mock"
printf '[driver]\nprocfs_gpus_dir = "/fakeproc/gpus"\n' >> "$work/runtime.toml"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
export GPUFENCE_NVML_LIBRARY=$mock
export MOCK_NVML_CONFIG=$work/etc-nvml/nvml.json
export MOCK_NVML_PROCESSES=$work/acct/processes
# SEED_CHECKS_RUNTIME=runc puts plain runc where gpufence-runtime goes, to see the checks fail.
shim=${SEED_CHECKS_RUNTIME:-$build/bin/gpufence-runtime}

smi_host() { LD_LIBRARY_PATH=$(dirname "$mock") "$build/bin/gpufence-smi" "$@"; }

# In the container: the host's /usr read-only (the dynamic tools' libraries), the mock mounted
# as a CDI spec mounts a driver library, the accounting directory, the fake driver procfs.
ctr_env='"LD_LIBRARY_PATH=/opt/driver","MOCK_NVML_CONFIG=/etc/mock-nvml/nvml.json","MOCK_NVML_VISIBILITY=driver","MOCK_NVML_PROCFS_DIR=/fakeproc/gpus","MOCK_NVML_PROCESSES=/run/mock-nvml/processes"'
bind() { printf '{"destination":"%s","type":"bind","source":"%s","options":["rbind","%s"]}' "$2" "$1" "${3:-ro}"; }
ctr_mounts="$(bind /usr /usr),$(bind "$(dirname "$mock")" /opt/driver),$(bind "$work/etc-nvml" /etc/mock-nvml),$(bind "$work/acct" /run/mock-nvml rw),$(bind "$node/fakeproc/gpus" /fakeproc/gpus)"

hexid() { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# new_bundle POD MODE ARGS ENV MOUNTS [MINORS]: a container shaped like containerd's (64-hex id,
# kubepods cgroup, CRI annotations). Sets NEW_ID (no subshell: cleanup must know every id); the
# bundle is $work/POD.
new_bundle() {
  local pod=$1 id b=$work/$1 app
  id=$(hexid)
  mkdir -p "$b"
  gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
  for app in sed head grep readlink; do ln -sf busybox "$b/rootfs/bin/$app"; done
  ln -s usr/lib "$b/rootfs/lib"; ln -s usr/lib64 "$b/rootfs/lib64"
  cp "$build/bin/gpufence-smi" "$build/bin/gpufence" "$src/tools/deepstream-stand-in/deepstream-app" "$b/rootfs/bin/"
  mkdir -p "$b/rootfs/app"
  printf '[application]\nenable-perf-measurement=1\n\n[source0]\nenable=1\ngpu-id=0\n\n[primary-gie]\nenable=1\ngpu-id=0  # the sample config'"'"'s note\nconfig-file=config_infer.txt\n' > "$b/rootfs/app/ds.txt"
  gf_write_spec "$b" "$2" "$3" "$ctr_env${4:+,$4}" "$ctr_mounts${5:+,$5}" \
    "\"io.kubernetes.cri.sandbox-name\":\"$pod\",\"io.kubernetes.cri.sandbox-namespace\":\"video\",\"io.kubernetes.cri.container-name\":\"deepstream\"" "$node" "${6:-}"
  sed -i 's|"linux":{|"linux":{"cgroupsPath":"/kubepods/besteffort/pod-seedchk-'"$pod"'/'"$id"'",|' "$b/config.json"
  ids+=("$id")
  NEW_ID=$id
}
run_to_end() {  # run_to_end RUNTIME POD ID: runs to completion, prints stdout (stderr in POD.err)
  "$1" --root "$state" run --bundle "$work/$2" "$3" </dev/null 2>"$work/$2.err"
}
start_detached() {  # start_detached RUNTIME POD ID: create + start; its output goes to POD.out
  "$1" --root "$state" create --bundle "$work/$2" "$3" </dev/null >"$work/$2.out" 2>"$work/$2.err" \
    || { echo "  create $2 failed:"; cat "$work/$2.err"; return 1; }
  "$1" --root "$state" start "$3"
}
init_pid() { runc --root "$state" state "$1" | sed -n 's/.*"pid": \([0-9]*\).*/\1/p'; }
wait_registered() {  # wait_registered N: until N apps registered (bounded; not a timing check)
  local _
  for _ in $(seq 300); do [ "$(wc -l < "$MOCK_NVML_PROCESSES")" -ge "$1" ] && return 0; sleep 0.1; done
  echo "  only $(wc -l < "$MOCK_NVML_PROCESSES") of $1 apps registered:"; cat "$work"/*.out "$work"/*.err 2>/dev/null | sed 's/^/    | /'
  return 1
}
start_pod_resources() {
  "$build/bin/gpufence-test-kubelet" --pod-resources "$work/pod-resources.sock" \
    --pod "video/ds-a/deepstream=$GPU0" --pod "video/ds-b/deepstream=$GPU1" --allocatable "$GPU0" --allocatable "$GPU1" &
  bg_pids+=($!)
  local _
  for _ in $(seq 300); do [ -S "$work/pod-resources.sock" ] && return 0; sleep 0.1; done
  echo "  the test kubelet's PodResources socket did not appear"; return 1
}
doctor() {
  "$build/bin/gpufence" doctor --pod-resources-socket "$work/pod-resources.sock" --runc-root "$state" \
    --containerd-config "$work/containerd.toml"
}
# The lines of `gpufence list` under one GPU's header.
gpu_block() { awk -v u="$1" '/^GPU /{on = index($0, u) > 0} on' <<<"$2"; }

ds_cmd='["/bin/deepstream-app","-c","/app/ds.txt"]'
launch_cmd='["/bin/gpufence","launch","--config","/app/ds.txt","--","deepstream-app","-c","/app/ds.txt"]'

case $case_name in  # gf:cases
  mock-visibility)
    proc=$node/fakeproc/gpus
    drv() { MOCK_NVML_VISIBILITY=driver MOCK_NVML_PROCFS_DIR=$proc MOCK_NVML_DEV_DIR=$node/dev smi_host "$@"; }
    out=$(smi_host)
    check "visibility off: both GPUs, whatever the node" count_is 2 '^GPU [01]: NVIDIA GeForce RTX 3080 \(UUID: GPU-' "$out"
    out=$(drv)
    check "driver visibility, both entries and nodes (ENXIO): both" count_is 2 '^GPU ' "$out"
    check "  in config order" has "^GPU 0: .*$GPU0\)$" "$out"
    mv "$proc/0000:01:00.0" "$work/hidden-entry"
    out=$(drv)
    check "GPU 0's procfs entry hidden: only GPU 1, as index 0" test "$out" = "GPU 0: NVIDIA GeForce RTX 3080 (UUID: $GPU1)"
    check "  its UUID selects as CUDA device 0" test "$(drv --cuda 0)" = "$GPU1"
    check "  no CUDA device 1" bash -c "! MOCK_NVML_VISIBILITY=driver MOCK_NVML_PROCFS_DIR=$proc MOCK_NVML_DEV_DIR=$node/dev LD_LIBRARY_PATH=$(dirname "$mock") $build/bin/gpufence-smi --cuda 1 2>/dev/null"
    mv "$work/hidden-entry" "$proc/0000:01:00.0"
    rm "$node/dev/nvidia1"
    out=$(drv)
    check "/dev/nvidia1 absent (ENOENT): only GPU 0" test "$out" = "GPU 0: NVIDIA GeForce RTX 3080 (UUID: $GPU0)"
    mknod -m 666 "$node/dev/nvidia1" c 195 1
    echo '{"visibility": "sometimes", "gpus": []}' > "$work/bad.json"
    out=$(MOCK_NVML_CONFIG=$work/bad.json smi_host 2>&1)
    check "a bad visibility value fails init, naming it" has "visibility 'sometimes'" "$out"
    # Accounting on the host: a live process counts, a dead one is dropped.
    sleep 1000 & live=$!; bg_pids+=("$live")
    sh -c 'exit 0' & dead=$!; wait $dead
    printf '%s %s 256\n%s %s 128\n' "$live" "$GPU1" "$dead" "$GPU1" > "$MOCK_NVML_PROCESSES"
    out=$("$build/bin/gpufence" list 2>&1)
    check "a registered live process is listed on its GPU" has "^    process $live  256 MiB$" "$(gpu_block $GPU1 "$out")"
    check "a process that is gone is dropped" hasnt "process $dead " "$out"
    check "GPU 0 has none" has "processes: none" "$(gpu_block $GPU0 "$out")"
    ;;
  listing)
    smi='["/bin/sh","-c","gpufence-smi; echo END"]'
    new_bundle ds-a unprivileged "$smi" "" "$(gf_marker_mount $GPU1)" 1; id=$NEW_ID
    out=$(run_to_end "$shim" ds-a "$id")
    check "through gpufence-runtime: exactly one GPU listed" count_is 1 '^GPU ' "$out"
    check "  and it is the allocated GPU 1, as index 0" has "^GPU 0: NVIDIA GeForce RTX 3080 \(UUID: $GPU1\)$" "$out"
    new_bundle ds-p privileged "$smi" "" "$(gf_marker_mount $GPU1)"; id=$NEW_ID
    out=$(run_to_end "$shim" ds-p "$id")
    check "privileged through gpufence-runtime: exactly one GPU listed" count_is 1 '^GPU ' "$out"
    check "  the allocated GPU 1" has "^GPU 0: NVIDIA GeForce RTX 3080 \(UUID: $GPU1\)$" "$out"
    new_bundle ds-b privileged "$smi" "\"NVIDIA_VISIBLE_DEVICES=$GPU1\"" ""; id=$NEW_ID
    out=$(run_to_end runc ds-b "$id")
    check "through plain runc, privileged: both GPUs listed" count_is 2 '^GPU [01]: ' "$out"
    check "  GPU 0 among them" has "\(UUID: $GPU0\)" "$out"
    ;;
  accounting|accounting-privileged)
    # unprivileged: the kubelet's device specs + marker; privileged (the seed's pods, kept
    # privileged): the marker alone, which gpufence-runtime trusts only in a privileged spec.
    if [ "$case_name" = accounting ]; then
      new_bundle ds-a unprivileged "$launch_cmd" "" "$(gf_marker_mount $GPU0)" 0; id_a=$NEW_ID
      new_bundle ds-b unprivileged "$launch_cmd" "" "$(gf_marker_mount $GPU1)" 1; id_b=$NEW_ID
    else
      new_bundle ds-a privileged "$launch_cmd" "" "$(gf_marker_mount $GPU0)"; id_a=$NEW_ID
      new_bundle ds-b privileged "$launch_cmd" "" "$(gf_marker_mount $GPU1)"; id_b=$NEW_ID
    fi
    start_detached "$shim" ds-a "$id_a" && start_detached "$shim" ds-b "$id_b"
    check "both apps registered" wait_registered 2
    pid_a=$(init_pid "$id_a"); pid_b=$(init_pid "$id_b")
    out=$("$build/bin/gpufence" list 2>&1)
    echo "---- gpufence list ----"; echo "$out"
    check "GPU 0: one process, ds-a's" test "$(gpu_block $GPU0 "$out" | grep -c '^    process ')" = 1
    check "  it is ds-a's pid $pid_a" has "^    process $pid_a " "$(gpu_block $GPU0 "$out")"
    check "GPU 1: one process, ds-b's" test "$(gpu_block $GPU1 "$out" | grep -c '^    process ')" = 1
    check "  it is ds-b's pid $pid_b" has "^    process $pid_b " "$(gpu_block $GPU1 "$out")"
    check "ds-a's app says GPU 0" has "running on $GPU0" "$(cat "$work/ds-a.out")"
    check "ds-b's app says GPU 1" has "running on $GPU1" "$(cat "$work/ds-b.out")"
    : > "$work/containerd.toml"
    "$build/bin/gpufence" setup containerd --config "$work/containerd.toml" --binary "$shim" >/dev/null
    start_pod_resources
    out=$(doctor)
    echo "---- gpufence doctor ----"; echo "$out"
    check "doctor: no process on an unallocated GPU" hasnt "gpu.process-on-unallocated" "$out"
    check "doctor: no shared GPU" hasnt "gpu.shared" "$out"
    ;;
  accounting-seed)
    new_bundle ds-a privileged "$ds_cmd" "\"NVIDIA_VISIBLE_DEVICES=$GPU0\"" ""; id_a=$NEW_ID
    new_bundle ds-b privileged "$ds_cmd" "\"NVIDIA_VISIBLE_DEVICES=$GPU1\"" ""; id_b=$NEW_ID
    start_detached runc ds-a "$id_a" && start_detached runc ds-b "$id_b"
    check "both apps registered" wait_registered 2
    pid_a=$(init_pid "$id_a"); pid_b=$(init_pid "$id_b")
    out=$("$build/bin/gpufence" list 2>&1)
    echo "---- gpufence list ----"; echo "$out"
    check "the seed's symptom: both processes on GPU 0" test "$(gpu_block $GPU0 "$out" | grep -c '^    process ')" = 2
    check "  ds-a's pid $pid_a and ds-b's pid $pid_b" bash -c "grep -q '^    process $pid_a ' <<<'$out' && grep -q '^    process $pid_b ' <<<'$out'"
    check "  none on GPU 1" has "processes: none" "$(gpu_block $GPU1 "$out")"
    { printf 'version = 2\n'; grep -v '^version' "$src/tests/fixtures/containerd/seed-snippet.toml"; } > "$work/containerd.toml"
    start_pod_resources
    out=$(doctor); rc=$?
    echo "---- gpufence doctor (exit $rc) ----"; echo "$out"
    check "doctor exits 1" test $rc = 1
    check "doctor: ds-b's process runs on GPU 0" has "gpu.process-on-unallocated\] container video/ds-b/deepstream was allocated GPU 1 .* but its processes run on GPU 0" "$out"
    check "doctor: two containers share GPU 0" has "gpu.shared\] 2 containers" "$out"
    check "doctor: the handler is missing in containerd" has "containerd.handler-missing" "$out"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
[ "$failures" = 0 ]
