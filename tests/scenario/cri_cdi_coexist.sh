#!/usr/bin/env bash
# GPU pods on a node that also has NVIDIA's toolkit, through containerd's CRI with CDI on
# (1.7 with enable_cdi = true, 2.x by default). NVIDIA's `nvidia-ctk cdi generate` (and the refresh
# unit of toolkit 1.18+) writes /var/run/cdi/nvidia.yaml: kind nvidia.com/gpu, devices named by
# index, by UUID and "all" (--device-name-strategy index,uuid). The device plugin writes its own
# spec into the same directory. The CDI cache drops every device name two specs of one directory
# define (docs/cdi.md, "Conflicts"): with the plugin on NVIDIA's kind, every GPU pod failed
# "unresolvable CDI devices". With the plugin's own kind (gpufence.io/gpu) both specs resolve:
# both pods start, each through containerd's own CDI injection and gpufence-runtime, and each
# reaches only its GPU.
# Usage: cri_cdi_coexist.sh LINE       (a line whose CRI resolves CDI: scripts/lib/containerd-lines.tsv)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_cdi_coexist.sh LINE}
if gf_line_has "$line" cdi-opt-in; then export GF_CRI_ENABLE_CDI=true  # off by default there
elif ! gf_line_has "$line" cdi; then skip "containerd $line does not resolve CDI devices itself"; fi
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
# shellcheck source=scripts/lib/seed_pods.sh
. "$src/scripts/lib/seed_pods.sh"

# NVIDIA's spec, in the shape nvidia-ctk v1.20 writes it, beside the plugin's (device hostPaths
# under this node's root, as the plugin's are).
python3 - "$plugin_cdi/nvidia.yaml" "$node" "${GPU[@]}" <<'PY'
import json, sys
path, root, uuids = sys.argv[1], sys.argv[2], sys.argv[3:]
def node(i):
    return {"path": f"/dev/nvidia{i}", "hostPath": f"{root}/dev/nvidia{i}"}
devices = []
for i, u in enumerate(uuids):
    for name in (str(i), u):
        devices.append({"name": name, "containerEdits": {"deviceNodes": [node(i)]}})
devices.append({"name": "all", "containerEdits": {"deviceNodes": [node(i) for i in range(len(uuids))]}})
spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                           "deviceNodes": [{"path": "/dev/nvidiactl", "hostPath": f"{root}/dev/nvidiactl"}]}}
# YAML is a superset of JSON: the file is what a .yaml reader reads.
open(path, "w").write(json.dumps(spec, indent=2) + "\n")
PY

echo "== two GPU pods, NVIDIA's nvidia.com/gpu spec beside the plugin's in one directory"
run_pods coexist gpufence 2
check "both pods ran" test "$(cat "$work/coexist.rc")" = 0
check "the plugin's spec is its own kind" grep -q '"kind": "gpufence.io/gpu"' "$plugin_cdi/gpufence.io-gpu.json"
check "NVIDIA's spec is still there, untouched" grep -q '"kind": "nvidia.com/gpu"' "$plugin_cdi/nvidia.yaml"
check "the pods hold different GPUs" test "$(gpu_of coexist 0)$(gpu_of coexist 1)" = 01 -o "$(gpu_of coexist 0)$(gpu_of coexist 1)" = 10
for p in 0 1; do
  own=$(gpu_of coexist $p); other=$((1 - ${own/\?/0}))
  check "pod $p opens its GPU $own" test "$(result coexist $p /dev/nvidia$own)" = ENXIO
  check "pod $p has no node for GPU $other" test "$(result coexist $p /dev/nvidia$other)" = ENOENT
  check "pod $p cannot open GPU $other even after mknod" test "$(result coexist $p /tmp/n$other)" != ENXIO -a -n "$(result coexist $p /tmp/n$other)"
  decision=$(grep -E "granted=${GPU[${own/\?/0}]}( |$)" "$work/coexist.decisions")
  check "gpufence-runtime granted pod $p GPU $own from the plugin's annotation" grep -q "channel=cdi-annotations" <<<"$decision"
  check "and applied the plugin's spec, not NVIDIA's" grep -q "cdi=\"gpufence.io/gpu=${GPU[${own/\?/0}]} ($plugin_cdi/gpufence.io-gpu.json)" <<<"$decision"
done

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line"; tail -30 "$work/containerd.log"; exit 1; }
echo "containerd $line: NVIDIA's spec and the plugin's coexist; all checks passed"
