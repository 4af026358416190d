#!/usr/bin/env bash
# gpufence doctor against a hostile container on a live node (real runc): its process re-execs
# with an env value of terminal escapes, a forged report line and bytes that are not UTF-8, and
# its spec carries an annotation "bundle" that runc turns into a label ahead of its own, pointing
# at a config.json that calls the container a sandbox. The doctor must still judge it, print no
# control character, and keep --json valid (docs/trust-model.md, "Files a pod controls").
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
. "$src/scripts/lib/bundle.sh"
[ "$(id -u)" = 0 ] || skip "needs root to run runc"
command -v runc >/dev/null || skip "runc is not installed"
command -v python3 >/dev/null || skip "python3 is needed to check the JSON"
[ -d /sys/fs/cgroup/devices ] || skip "needs the cgroup v1 devices controller"
why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"

work=$(gf_work_dir gpufence-hostile)
state=$work/state
id=""; pr_pid=""
cleanup() {
  [ -n "$pr_pid" ] && kill "$pr_pid" 2>/dev/null
  [ -n "$id" ] && runc --root "$state" delete --force "$id" >/dev/null 2>&1
  rmdir /sys/fs/cgroup/*/kubepods/besteffort/pod-evil-$$ 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)
GPU0=${GPU[0]} GPU1=${GPU[1]}
node=$work/node
gf_make_node_root "$node"
export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
cat > "$work/nvml.json" <<JSON
{"driver_version": "550.54.15", "gpus": [
 {"uuid": "$GPU0", "name": "NVIDIA GeForce RTX 3080", "minor": 0, "pci_bus_id": "00000000:01:00.0", "memory_total": 10737418240, "processes": []},
 {"uuid": "$GPU1", "name": "NVIDIA GeForce RTX 3080", "minor": 1, "pci_bus_id": "00000000:02:00.0", "memory_total": 10737418240, "processes": []}]}
JSON
export MOCK_NVML_CONFIG=$work/nvml.json

# The pod's own config.json somewhere on the host (its rootfs's upper dir, say).
mkdir -p "$work/evil"
printf '{"annotations":{"io.kubernetes.cri.container-type":"sandbox"}}' > "$work/evil/config.json"

id=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
b=$work/bundle
mkdir -p "$b"
gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
ln -sf busybox "$b/rootfs/bin/printf"
cat > "$b/rootfs/bin/evil.sh" <<'SH'
#!/bin/sh
v=$(printf 'all\033[2J\033[H\r\n- [gpu.ok] every GPU is allocated right\377\376')
exec env -i "NVIDIA_VISIBLE_DEVICES=$v" /bin/sleep 120
SH
chmod +x "$b/rootfs/bin/evil.sh"
# Privileged, as the seed's pods are: its devices cgroup admits every GPU.
gf_write_spec "$b" privileged '["/bin/sh","/bin/evil.sh"]' "" "" \
  "\"bundle\":\"$work/evil\",\"io.kubernetes.cri.sandbox-name\":\"evil\",\"io.kubernetes.cri.sandbox-namespace\":\"video\",\"io.kubernetes.cri.container-name\":\"app\",\"io.kubernetes.cri.container-type\":\"container\"" "$node"
sed -i 's|"linux":{|"linux":{"cgroupsPath":"/kubepods/besteffort/pod-evil-'"$$"'/'"$id"'",|' "$b/config.json"
runc --root "$state" create --bundle "$b" "$id" </dev/null >/dev/null 2>"$work/err" || { cat "$work/err"; exit 1; }
runc --root "$state" start "$id"
pid=$(runc --root "$state" state "$id" | sed -n 's/.*"pid": \([0-9]*\).*/\1/p')
for _ in $(seq 50); do grep -q NVIDIA_VISIBLE_DEVICES "/proc/$pid/environ" 2>/dev/null && break; sleep 0.1; done
check "control: the process holds the hostile env" grep -q "gpu.ok" "/proc/$pid/environ"
check "control: runc's labels name the pod's bundle first" \
  python3 -c "import json,sys; l=[x for x in json.load(open('$state/$id/state.json'))['config']['labels'] if x.startswith('bundle=')]; sys.exit(not (len(l)==2 and l[0]=='bundle=$work/evil'))"

"$build/bin/gpufence-test-kubelet" --pod-resources "$work/pod-resources.sock" \
  --pod "video/evil/app=" --allocatable "$GPU0" --allocatable "$GPU1" &
pr_pid=$!
for _ in $(seq 300); do [ -S "$work/pod-resources.sock" ] && break; sleep 0.1; done
: > "$work/containerd.toml"
doctor() {
  "$build/bin/gpufence" doctor --pod-resources-socket "$work/pod-resources.sock" --runc-root "$state" \
    --containerd-config "$work/containerd.toml" "$@"
}
doctor > "$work/text"; rc=$?
doctor --json > "$work/json"; jrc=$?
echo "---- doctor (exit $rc) ----"; cat -v "$work/text"
check "text: judged, not hidden as a sandbox" grep -q "gpu.no-request-can-open\] container video/evil/app requested no GPU but can open GPU 0" "$work/text"
check "text: exit 1" test $rc = 1
check "text: no ESC" bash -c "! grep -q \$'\x1b' '$work/text'"
check "text: no CR" bash -c "! grep -q \$'\r' '$work/text'"
check "text: no forged finding line" bash -c "! grep -q '^- \[gpu.ok\]' '$work/text'"
check "text: the value is shown escaped" grep -qF 'all\x1b[2J\x1b[H\x0d\x0a- [gpu.ok]' "$work/text"
check "json: exit 1, not a crash" test $jrc = 1
check "json: valid and ASCII" python3 -c "import json; d=json.loads(open('$work/json','rb').read().decode('ascii')); assert any(f['id']=='gpu.no-request-can-open' for f in d['findings'])"
[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "all checks passed"
