# shellcheck shell=bash disable=SC2154  # work, node, build, cfg, runc_root, GPU come from cri_node.sh
# The seed's DeepStream pods on the simulated node of scripts/lib/cri_node.sh (source it after
# that): what each pod gets (image, volumes, env), the two commands (the gpufence way through
# `gpufence launch`, the seed's deepstream-app run directly), and how the host looks at them
# (`gpufence list`, `gpufence doctor`). Used by tests/scenario/cri_seed.sh and scripts/demo_cri.sh;
# docs/containerd-lines.md, check 5.
mkdir -p "$work/etc-nvml" "$work/acct"
cat > "$work/etc-nvml/nvml.json" <<JSON
{"driver_version": "550.54.15", "gpus": [
 {"uuid": "${GPU[0]}", "name": "NVIDIA GeForce RTX 3080", "minor": 0, "pci_bus_id": "00000000:01:00.0", "memory_total": 10737418240},
 {"uuid": "${GPU[1]}", "name": "NVIDIA GeForce RTX 3080", "minor": 1, "pci_bus_id": "00000000:02:00.0", "memory_total": 10737418240}]}
JSON
mock_dir=$build/lib/mock-nvml/default
seed_pod=(--namespace video --container-name deepstream
  --volume /usr:/usr --volume "$build/bin:/opt/gpufence/bin" --volume "$mock_dir:/opt/driver"
  --volume "$work/etc-nvml:/etc/mock-nvml" --volume "$work/acct:/run/mock-nvml:rw"
  --volume "$node/fakeproc/gpus:/fakeproc/gpus"
  --env PATH=/bin:/opt/gpufence/bin --env LD_LIBRARY_PATH=/opt/driver
  --env MOCK_NVML_CONFIG=/etc/mock-nvml/nvml.json --env MOCK_NVML_VISIBILITY=driver
  --env MOCK_NVML_PROCFS_DIR=/fakeproc/gpus --env MOCK_NVML_PROCESSES=/run/mock-nvml/processes)
# A privileged container gets every device node of the host's /dev (containerd's privileged mode);
# this node's GPU nodes live under $node/dev, so privileged pods get them as volumes at the same
# paths: what the seed's privileged pods see. gpufence-runtime's device cgroup still decides.
host_dev=(--volume "$node/dev/nvidia0:/dev/nvidia0:rw" --volume "$node/dev/nvidia1:/dev/nvidia1:rw")
launch='exec gpufence launch --config /app/ds.txt -- deepstream-app -c /app/ds.txt'
seed_app='exec deepstream-app -c /app/ds.txt'
# On the host, gpufence reads the same NVML (the mock, every GPU, the accounting file).
host_gpufence() {
  MOCK_NVML_CONFIG=$work/etc-nvml/nvml.json MOCK_NVML_PROCESSES=$work/acct/processes \
    GPUFENCE_NVML_LIBRARY=$mock_dir/libnvidia-ml.so.1 "$build/bin/gpufence" "$@"
}
# seed_isolated NAME: checks 2b and 3 on a run gpufence enforced (needs the caller's `check`):
# each pod lists one GPU, its own, its app runs there, and the doctor finds nothing.
seed_isolated() {
  local name=$1 p own uuid
  check "$name: both pods ran" test "$(cat "$work/$name.rc")" = 0
  for p in 0 1; do
    own=$(gpu_of "$name" $p); uuid=${GPU[${own/\?/0}]}
    check "$name: pod $p's nvidia-smi -L lists one GPU" test "$(smi_lines "$name" $p)" = 1
    check "$name: it is the pod's own GPU $own" test "$(smi_uuid "$name" $p)" = "UUID:$uuid" -o "$(smi_uuid "$name" $p)" = "$uuid"
    check "$name: pod $p's app runs on its own GPU $own" test "$(app_says "$name" $p)" = "$uuid"
    check "$name: gpufence list shows one process on GPU $own" test "$(procs_on "$uuid" "$work/$name.list")" = 1
  done
  check "$name: doctor finds no process on an unallocated GPU" bash -c "! grep -q gpu.process-on-unallocated '$work/$name.doctor'"
  check "$name: doctor finds no shared GPU" bash -c "! grep -q gpu.shared '$work/$name.doctor'"
}
# look NAME: while NAME's pods run, once both apps registered: gpufence list and gpufence doctor
# (this node's PodResources, runc state and containerd config) into NAME.list / NAME.doctor.
look() {
  local _
  for _ in $(seq 100); do [ "$(wc -l < "$work/acct/processes")" -ge 2 ] && break; sleep 0.1; done
  host_gpufence list > "$work/$1.list" 2>&1
  host_gpufence doctor --pod-resources-socket "$work/pod-resources-$1.sock" --runc-root "$runc_root" \
    --containerd-config "$cfg" --handler gpufence --app-config /app/ds.txt > "$work/$1.doctor" 2>&1
  echo $? > "$work/$1.doctor-rc"
}
gpu_block() { awk -v u="$1" '/^GPU /{on = index($0, u) > 0} on' "$2"; }
procs_on() { gpu_block "$1" "$2" | grep -c '^    process '; }
app_says() { awk -v p="$2" '$1=="pod" && $2==p && $3=="exec" && $4=="deepstream-app:" && $5=="running" {print $7}' "$work/$1.out" | head -1; }
smi_lines() { awk -v p="$2" '$1=="pod" && $2==p && $3=="exec" && $4=="GPU" {c++} END {print c+0}' "$work/$1.out"; }
smi_uuid() { awk -v p="$2" '$1=="pod" && $2==p && $3=="exec" && $4=="GPU" {print $NF}' "$work/$1.out" | tr -d '()' | head -1; }
# Inside each pod: the nvidia-smi -L stand-in, and the app's own line (its stdout is the
# container log; the app also wrote it where the exec can read it back). The exec runs as soon
# as every pod runs, maybe before the app has written its line: it waits for it (20 s at most).
seed_exec='gpufence-smi; i=0; while [ $i -lt 200 ] && ! grep -q "running on" /tmp/app.out 2>/dev/null; do sleep 0.1; i=$((i + 1)); done; cat /tmp/app.out 2>/dev/null'
seed_shell() { echo "$1 > /tmp/app.out 2>&1"; }


# result NAME POD PATH: the probe's answer for PATH in that pod.
result() { awk -v p="$2" -v f="$3" '$1=="pod" && $2==p && $3=="exec" && $4==f {print $5}' "$work/$1.out"; }
gpu_of() {  # gpu_of NAME POD: the index of the GPU the pod was allocated
  local id; id=$(awk -v p="$2" '$1=="pod" && $2==p && $3=="ids" {print $4}' "$work/$1.out")
  case $id in "${GPU[0]}") echo 0 ;; "${GPU[1]}") echo 1 ;; *) echo "?" ;; esac
}
