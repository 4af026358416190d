#!/usr/bin/env bash
# One prepared check for a machine with a real NVIDIA driver (run as root, under 5 minutes).
# Prints one PASS/FAIL/SKIP line per step and exits non-zero if any step failed.
# Steps that need two GPUs say so and skip on one.
#   bash scripts/gpu-node-check.sh [BUILD_DIR]
# Written for the workplace's lent GPU machine; not yet run on a real driver (no GPU was lent to
# the session that wrote it): expect to fix details on its first run.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
work=$(mktemp -d /tmp/gpufence-gpucheck-XXXXXX)
plugin_pid=""; kubelet_pid=""
trap '[ -n "$plugin_pid" ] && kill "$plugin_pid" 2>/dev/null; [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null; runc --root "$work/state" delete --force gpucheck >/dev/null 2>&1; rm -rf "$work"' EXIT
failed=0
step() { printf '%-5s %s\n' "$1" "$2"; [ "$1" = FAIL ] && failed=1; return 0; }

# 1. build (installs the Debian packages it needs)
if [ -x "$build/bin/gpufence" ] || make -C "$here" build >"$work/build.log" 2>&1; then
  step PASS "build"
else
  step FAIL "build (tail: $(tail -3 "$work/build.log" | tr '\n' ' '))"; exit 1
fi
command -v nvidia-smi >/dev/null || { step FAIL "nvidia-smi not found: is the NVIDIA driver installed?"; exit 1; }
nvidia-smi -L > "$work/smi-L" 2>&1 || { step FAIL "nvidia-smi -L: $(head -1 "$work/smi-L")"; exit 1; }
count=$(grep -c '^GPU ' "$work/smi-L")
echo "info  $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1) driver, $count GPU(s)"

# 2. gpufence list against the real libnvidia-ml vs nvidia-smi: UUID, minor, bus id, memory, NUMA
"$build/bin/gpufence" list --json > "$work/list.json" 2>"$work/list.err"
if [ $? -eq 0 ]; then
  ok=1
  while read -r idx uuid bus mem; do
    python3 - "$work/list.json" "$idx" "$uuid" "$bus" "$mem" <<'PY' || ok=0
import json, sys
doc = json.load(open(sys.argv[1])); idx, uuid, bus, mem = int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
g = [x for x in doc["gpus"] if x["uuid"] == uuid]
assert g, f"{uuid} missing"
g = g[0]
assert g["index"] == idx, f"index {g['index']} != {idx}"
assert g["pci_bus_id"].lower().endswith(bus.lower()[-12:]), f"bus {g['pci_bus_id']} != {bus}"
assert abs(g['memory_total_bytes'] // (1 << 20) - mem) <= 1, f"memory {g['memory_total_bytes']} vs {mem} MiB"
PY
  done < <(nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total --format=csv,noheader,nounits | tr -d ' ' | tr ',' ' ')
  for u in $(nvidia-smi --query-gpu=uuid --format=csv,noheader); do
    minor=$(nvidia-smi -q -i "$u" | awk -F: '/Minor Number/ {gsub(/ /,"",$2); print $2}')
    grep -q "\"minor\": *$minor" "$work/list.json" || ok=0
  done
  [ $ok = 1 ] && step PASS "gpufence list matches nvidia-smi (UUID, index, bus id, memory, minor)" \
             || step FAIL "gpufence list differs from nvidia-smi (see $work/list.json)"
else
  step FAIL "gpufence list: $(head -2 "$work/list.err")"
fi

# 3. the device plugin against real NVML and the test kubelet: registration, Allocate, XID events
mkdir -p "$work/dp"
"$build/bin/gpufence-test-kubelet" --plugin-dir "$work/dp" --admit 1 > "$work/admit" 2>&1 &
kubelet_pid=$!
for _ in $(seq 100); do [ -S "$work/dp/kubelet.sock" ] && break; sleep 0.05; done
"$build/bin/gpufence-device-plugin" --plugin-dir "$work/dp" --cdi-spec-dir "$work/plugin-cdi" \
  --log-file "$work/plugin.log" &
plugin_pid=$!
if timeout 60 tail --pid="$kubelet_pid" -f /dev/null && wait "$kubelet_pid"; then
  step PASS "device plugin registered and answered Allocate ($(awk '$2=="ids" {print $3}' "$work/admit" | head -1))"
else
  step FAIL "device plugin: $(tail -3 "$work/admit" "$work/plugin.log" | tr '\n' ' ')"
fi
kubelet_pid=""
grep -q "gpu_events_unregistered" "$work/plugin.log" \
  && step FAIL "XID event registration failed on some GPU: $(grep gpu_events_unregistered "$work/plugin.log")" \
  || step PASS "XID events registered on every GPU"
kill "$plugin_pid" 2>/dev/null; wait "$plugin_pid" 2>/dev/null; plugin_pid=""

# 4. a container through gpufence-runtime with the real /dev/nvidia* and driver procfs
. "$here/scripts/lib/bundle.sh"
uuid0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
bus0=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
minor0=$(nvidia-smi -q -i "$uuid0" | awk -F: '/Minor Number/ {gsub(/ /,"",$2); print $2}')
mkdir -p "$work/b"
gf_make_rootfs "$work/b/rootfs" "$build/bin/gpufence-probe"
args='["/bin/sh","-c","ls /proc/driver/nvidia/gpus; for n in /dev/nvidia*; do gpufence-probe $n; done"]'
gf_write_spec "$work/b" unprivileged "$args" "" "" "\"cdi.k8s.io/gpufence_x\":\"nvidia.com/gpu=$uuid0\"" /
printf '[log]\nfile = "%s/runtime.log"\n' "$work" > "$work/runtime.toml"
out=$(GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml "$build/bin/gpufence-runtime" --root "$work/state" run --bundle "$work/b" gpucheck 2>&1)
entries=$(grep -cE '^[0-9a-f]{4}:' <<<"$out")
if grep -q "/dev/nvidia$minor0 OK" <<<"$out" && [ "$entries" = 1 ]; then
  step PASS "container: its GPU opens, the driver lists only its entry ($(grep -E '^[0-9a-f]{4}:' <<<"$out"))"
else
  step FAIL "container: $(tr '\n' ' ' <<<"$out")"
fi
grep -q "/dev/nvidiactl OK" <<<"$out" && step PASS "container: control node opens" || step FAIL "container: /dev/nvidiactl"
if [ "$count" -ge 2 ]; then
  other=$(grep -E '^/dev/nvidia[0-9]+ ' <<<"$out" | grep -v "^/dev/nvidia$minor0 " | head -1)
  [ -z "$other" ] && step PASS "container: no other GPU node (2 GPUs)" || step FAIL "container: $other"
else
  step SKIP "container: other GPUs absent (needs two GPUs)"
fi

# 5. cdi generate + validate on the real driver
if "$build/bin/gpufence" cdi generate --output "$work/nvidia.yaml" >"$work/cdi.log" 2>&1 &&
   "$build/bin/gpufence" cdi validate "$work/nvidia.yaml" >>"$work/cdi.log" 2>&1; then
  step PASS "cdi generate + validate ($(grep -c 'name:' "$work/nvidia.yaml") devices)"
else
  step FAIL "cdi: $(tail -3 "$work/cdi.log" | tr '\n' ' ')"
fi
echo "info  bus id of GPU 0: $bus0"
exit $failed
