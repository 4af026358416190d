#!/usr/bin/env bash
# What the kubelet and containerd do around a GPU pod, through the CRI of a private containerd of
# the line with the gpufence handler, the real device plugin and the stand-in kubelet
# (gpufence-test-cri), each case a behaviour the stand-in now follows (docs/containerd-lines.md,
# "The stand-in kubelet, function by function"):
#   env-override  the kubelet puts the device plugin's env first and the pod's after it; the last
#                 wins. With trusted_channels "envvar" and the plugin's envvar strategy, a pod
#                 whose env names NVIDIA_VISIBLE_DEVICES would choose its GPU: refused.
#   pod-annotation a pod that asks for no GPU carries cdi.k8s.io/x: <kind>=<uuid>; containerd copies
#                 pod annotations matching the handler's pod_annotations into the container spec.
#                 setup drops the broad pattern it inherits, and the pod gets nothing; written back
#                 by hand, check-containerd reports it and the pod gets that GPU (the control).
#   checkpoint    the Allocate answer is stored and replayed: on a container restart and a kubelet
#                 restart no Allocate is made; after a reboot that swapped the GPUs' minors the
#                 replayed device specs name the other GPU: the doctor reports it
#                 (gpu.checkpoint-renumbered), the create is refused with the reason and the
#                 remedy, never granted (with and without CDI annotations), and fresh pods run.
#   init-container an init container and the app container of one pod: the kubelet's second
#                 Allocate names the same GPU, and both containers get it, and only it.
# Usage: cri_kubelet.sh LINE CASE     LINE = 1.6 | 1.7 | 2
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_kubelet.sh LINE CASE}
case_name=${2:?usage: cri_kubelet.sh LINE CASE}
GF_CRI_WORK_PREFIX=gpufence-cri-kubelet
broad_pattern() {  # the user's runc runtime copies every cdi.k8s.io/ pod annotation
  sed -i -E 's|^( *)pod_annotations = \[\]|\1pod_annotations = ["cdi.k8s.io/*"]|' "$1"
}
[ "$case_name" = pod-annotation ] && GF_CRI_BEFORE_SETUP=broad_pattern
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
# shellcheck source=scripts/lib/seed_pods.sh
. "$src/scripts/lib/seed_pods.sh"
# The plugin's CDI kind, as the product's wire contract names it (src/gpu/wire_contract.hpp).
kind=$(sed -n 's/.*kCdiKind = "\([^"]*\)".*/\1/p' "$src/src/gpu/wire_contract.hpp")
no_grant() { ! grep -q 'granted=GPU' "$work/$1.decisions"; }
# isolated NAME POD LABEL: the probe in that pod (LABEL: its exec label) opens only its own GPU.
isolated() {
  local own other
  own=$(gpu_of "$1" "$2"); other=$((1 - ${own/\?/0}))
  check "$1: pod $3 opens its GPU $own" test "$(result "$1" "$3" "/dev/nvidia$own")" = ENXIO
  check "$1: pod $3 has no node for GPU $other" test "$(result "$1" "$3" "/dev/nvidia$other")" = ENOENT
  check "$1: pod $3 cannot open GPU $other even after mknod" test "$(result "$1" "$3" "/tmp/n$other")" != ENXIO -a -n "$(result "$1" "$3" "/tmp/n$other")"
}

case $case_name in  # gf:cases
  env-override)
    # What an exec'd process (kubectl exec, ExecSync) sees: the environment containerd stored,
    # which keeps both entries in the kubelet's order: the pod's "all" comes last and wins. (2.x
    # applies the plugin's CDI spec itself, whose env, NVIDIA_VISIBLE_DEVICES=void, comes after.)
    RUN_EXEC='echo NVD=$NVIDIA_VISIBLE_DEVICES' run_pods exec-env gpufence 1 --env NVIDIA_VISIBLE_DEVICES=all
    expected=all; gf_line_has "$line" cdi && expected=void
    check "exec-env: the pod ran (the env is not trusted by default)" test "$(cat "$work/exec-env.rc")" = 0
    check "exec-env: an exec'd process sees NVIDIA_VISIBLE_DEVICES=$expected, not the plugin's value" \
      grep -qx "pod 0 exec NVD=$expected" "$work/exec-env.out"
    printf '[allocation]\ntrusted_channels = ["cdi-annotations", "mount-markers", "envvar"]\n' >> "$work/runtime.toml"
    envvar=(--device-list-strategy envvar)
    # The control: with the plugin's envvar strategy alone the env is the allocation, and
    # gpufence-runtime (opted in) takes it.
    RUN_PLUGIN_ARGS="${envvar[*]}" run_pods honest gpufence 2
    check "honest: both pods ran" test "$(cat "$work/honest.rc")" = 0
    for p in 0 1; do isolated honest $p $p; done
    check "honest: granted from the env" grep -q 'channel=envvar' "$work/honest.decisions"
    # The pod's env after the plugin's: NVIDIA_VISIBLE_DEVICES=all would win.
    RUN_PLUGIN_ARGS="${envvar[*]}" run_pods override gpufence 2 --env NVIDIA_VISIBLE_DEVICES=all
    check "override: no pod runs" test "$(grep -c ' running ' "$work/override.out")" = 0
    check "override: refused at create: the pod's env overrides the plugin's" \
      test "$(grep -Ec 'error (Create|Start)Container: .*NVIDIA_VISIBLE_DEVICES is set 2 times with values that disagree' "$work/override.out")" = 2
    check "override: gpufence-runtime granted nothing" no_grant override
    # Bytes a pod controls reach the refusal escaped (an ESC would drive the reader's terminal).
    RUN_PLUGIN_ARGS="${envvar[*]}" run_pods hostile gpufence 1 --env "NVIDIA_VISIBLE_DEVICES=$(printf '1\033[2J')"
    check "hostile: refused, the pod's value escaped" grep -qF 'x1b[2J"' "$work/hostile.out"
    check "hostile: no raw ESC in the refusal" bash -c "! grep -q $'\033' '$work/hostile.out'"
    ;;
  pod-annotation)
    forged=(--gpus 0 --pod-annotation "cdi.k8s.io/x=$kind=${GPU[1]}")
    check "setup dropped the inherited broad pod_annotations pattern" \
      grep -q 'pod_annotations "cdi.k8s.io/\*"' "$work/setup.log"
    run_pods forged gpufence 1 "${forged[@]}"
    check "forged: the pod ran" test "$(cat "$work/forged.rc")" = 0
    check "forged: the stand-in allocated nothing" grep -qx "node capacity 2 allocated 0" "$work/forged.out"
    check "forged: it opens no GPU" test "$(result forged 0 /dev/nvidia1)" != ENXIO -a "$(result forged 0 /tmp/n1)" != ENXIO
    check "forged: gpufence-runtime granted nothing" no_grant forged
    # The control: the broad pattern written into the handler by hand. check-containerd reports
    # it; containerd copies the pod's annotation into the spec, where it reads as the kubelet's.
    # The handler's table, where setup wrote it (the main file, or a drop-in of conf.d).
    python3 - "$cfg" "$work"/conf.d/*.toml <<'PY'
import re, sys
for path in sys.argv[1:]:
    try:
        text = open(path).read()
    except OSError:
        continue
    head = re.search(r'^\s*\[plugins\.[^\n]*runtimes\.gpufence\]\s*$', text, re.M)
    if not head:
        continue
    rest = text[head.end():]
    nxt = re.search(r'^\s*\[', rest, re.M)
    body = rest[: nxt.start() if nxt else len(rest)]
    body2, n = re.subn(r'pod_annotations = \[[^\]]*\]', 'pod_annotations = ["cdi.k8s.io/*"]', body)
    if n == 0:
        body2 = '\n  pod_annotations = ["cdi.k8s.io/*"]' + body
    open(path, 'w').write(text[: head.end()] + body2 + rest[len(body):])
    sys.exit(0)
sys.exit("no [..runtimes.gpufence] table found")
PY
    "$build/bin/gpufence" setup check-containerd --config "$cfg" --handler gpufence > "$work/check.out" 2>&1
    check "check-containerd reports the broad pattern of the handler" grep -q 'cdi.k8s.io/\*' "$work/check.out"
    restart_containerd || { echo "containerd did not come back"; exit 1; }
    run_pods broad gpufence 1 "${forged[@]}"
    check "broad: containerd copied the pod's annotation: the pod reaches GPU 1" test "$(result broad 0 /dev/nvidia1)" = ENXIO
    check "broad: gpufence-runtime took it as the kubelet's" grep -q "granted=${GPU[1]}" "$work/broad.decisions"
    ;;
  checkpoint)
    mkdir -p "$work/device-plugins"  # where the kubelet keeps its checkpoint, for the doctor
    ck=(--pod-uid-prefix ck --checkpoint "$work/device-plugins/kubelet_internal_checkpoint")
    dm=(--pod-uid-prefix dm --checkpoint "$work/checkpoint-dm")
    dm_plugin="--device-list-strategy device-specs,volume-mounts"
    RUN_EXEC=$probe run_pods first gpufence 2 "${ck[@]}" --restart-container
    check "first: both pods ran" test "$(cat "$work/first.rc")" = 0
    check "first: the checkpoint has the upstream shape" \
      python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['Data']; assert len(d['PodDeviceEntries'])==2 and 'AllocResp' in d['PodDeviceEntries'][0]" "$work/device-plugins/kubelet_internal_checkpoint"
    check "first: two Allocate calls for two pods and two restarts" grep -qx "plugin allocate calls 2" "$work/first.out"
    for p in 0 1; do
      isolated first $p $p
      check "first: pod $p restarted from the stored answer" grep -qx "pod $p replayed app $(awk -v p=$p '$1=="pod" && $2==p && $3=="ids" {print $4}' "$work/first.out")" "$work/first.out"
      isolated first $p "${p}r"
    done
    # A kubelet restart: the same pods (UIDs), the stored answers, no Allocate.
    run_pods again gpufence 2 "${ck[@]}"
    check "again: both pods ran" test "$(cat "$work/again.rc")" = 0
    check "again: no Allocate call" grep -qx "plugin allocate calls 0" "$work/again.out"
    for p in 0 1; do
      check "again: pod $p holds the GPU stored for it" test "$(gpu_of again $p)" = "$(gpu_of first $p)"
      isolated again $p $p
    done
    # Device specs and markers only (no CDI annotation), before the reboot.
    RUN_PLUGIN_ARGS=$dm_plugin run_pods dm-first gpufence 2 "${dm[@]}"
    check "dm-first: both pods ran" test "$(cat "$work/dm-first.rc")" = 0
    for p in 0 1; do isolated dm-first $p $p; done
    doctor() {
      MOCK_NVML_CONFIG=$work/nvml.json "$build/bin/gpufence" doctor --device-plugin-dir "$work/device-plugins" \
        --pod-resources-socket "$work/none.sock" --runc-root "$runc_root" > "$work/doctor-$1.out" 2>&1
    }
    doctor before
    check "before the reboot: the doctor finds the stored answers current" \
      bash -c "! grep -q gpu.checkpoint-renumbered '$work/doctor-before.out'"
    # The reboot: the driver numbers the GPUs the other way (minor 0 <-> 1), the pods keep their
    # UIDs, the kubelet replays its checkpoint.
    for f in "$node"/proc/driver/nvidia/gpus/*/information "$node"/fakeproc/gpus/*/information; do
      sed -i -E 's/^(Device Minor:\s*)([01])$/\1X\2/; s/X0$/1/; s/X1$/0/' "$f"
    done
    python3 - "$work/nvml.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
for g in c["gpus"]: g["minor"] = 1 - g["minor"]
json.dump(c, open(p, "w"))
PY
    check "reboot: the driver now gives GPU 0 minor 1" grep -q 'Device Minor:.*1$' "$node/proc/driver/nvidia/gpus/0000:01:00.0/information"
    # The doctor, before the pods are restarted, says what will happen and what to do.
    doctor reboot
    check "reboot: the doctor reports the stored answers with the old minors" \
      test "$(grep -c 'gpu.checkpoint-renumbered\]' "$work/doctor-reboot.out")" = 2
    check "reboot: and says to delete the pods" grep -q 'delete the pod so that' "$work/doctor-reboot.out"
    grep -A3 'checkpoint-renumbered\]' "$work/doctor-reboot.out" | sed 's/^/  [doctor-reboot] /'
    run_pods reboot gpufence 2 "${ck[@]}"
    check "reboot: no Allocate call" grep -qx "plugin allocate calls 0" "$work/reboot.out"
    check "reboot: no pod runs" test "$(grep -c ' running ' "$work/reboot.out")" = 0
    check "reboot: the refusal says the minors changed and what to do" \
      test "$(grep -Ec 'error (Create|Start)Container: .*minor numbers changed.*delete the pod' "$work/reboot.out")" = 2
    check "reboot: gpufence-runtime granted nothing" no_grant reboot
    RUN_PLUGIN_ARGS=$dm_plugin run_pods dm-reboot gpufence 2 "${dm[@]}"
    check "dm-reboot: no pod runs holding the GPU its minor now names" test "$(grep -c ' running ' "$work/dm-reboot.out")" = 0
    check "dm-reboot: refused, the marker and the device spec disagree" \
      test "$(grep -Ec 'error (Create|Start)Container: .*a mount marker names .*minor numbers changed' "$work/dm-reboot.out")" = 2
    check "dm-reboot: gpufence-runtime granted nothing" no_grant dm-reboot
    # The remedy: the pods deleted and recreated (new UIDs) are admitted afresh and run.
    run_pods fresh gpufence 2
    check "fresh: both pods ran" test "$(cat "$work/fresh.rc")" = 0
    for p in 0 1; do
      uuid=$(awk -v p=$p '$1=="pod" && $2==p && $3=="ids" {print $4}' "$work/fresh.out")
      check "fresh: pod $p was granted its allocated GPU" grep -q "granted=$uuid " "$work/fresh.decisions"
    done
    ;;
  init-container)
    mkdir -p "$work/init"
    init_probe='for m in 0 1; do gpufence-probe /dev/nvidia$m; done > /v/$CUDA_VISIBLE_DEVICES'
    run_pods init gpufence 2 --volume "$work/init:/v:rw" --init-shell "$init_probe"
    check "init: both pods ran" test "$(cat "$work/init.rc")" = 0
    check "init: the stand-in shows 2 of 2 GPUs allocated" grep -qx "node capacity 2 allocated 2" "$work/init.out"
    check "init: four Allocate calls (init and app container of each pod)" grep -qx "plugin allocate calls 4" "$work/init.out"
    for p in 0 1; do
      own=$(gpu_of init $p); other=$((1 - ${own/\?/0}))
      check "init: pod $p's init container ran to completion" grep -qx "pod $p init exited 0" "$work/init.out"
      check "init: pod $p's second Allocate named the init container's GPU" \
        test "$(awk -v p=$p '$1=="pod" && $2==p && $3=="init" && $4=="ids" {print $5}' "$work/init.out")" = "${GPU[${own/\?/0}]}"
      check "init: pod $p's init container opened its GPU $own" grep -qx "/dev/nvidia$own ENXIO" "$work/init/${GPU[${own/\?/0}]}"
      check "init: and had no node for GPU $other" grep -qx "/dev/nvidia$other ENOENT" "$work/init/${GPU[${own/\?/0}]}"
      isolated init $p $p
      check "init: gpufence-runtime granted pod $p's GPU to both containers" \
        test "$(grep -c "granted=${GPU[${own/\?/0}]} " "$work/init.decisions")" = 2
    done
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line"; tail -30 "$work/containerd.log"; exit 1; }
echo "containerd $line: all checks passed"
