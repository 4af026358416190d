#!/usr/bin/env bash
# The seed's node for real, through containerd's CRI: the test kubelet (gpufence-test-cri) admits
# two GPU pods through the real gpufence-device-plugin and runs them through a private containerd
# of the given line (1.6: Debian 12's; 1.7: trixie's; 2: sid's, fetched by
# scripts/fetch-containerd.sh) with the handler `gpufence setup containerd` added
# (containerd-shim-runc-v2 -> gpufence-runtime -> runc). See docs/containerd-lines.md.
# Checks: the stand-in shows 2 of 2 GPUs allocated; inside each pod only its own GPU opens (the
# probe's errno oracle), unprivileged and privileged; and the same privileged pods through the
# plain runc handler leak (the other GPU opens), so the test fails if gpufence-runtime is replaced
# by runc (GF_CRI_HANDLER_BINARY=runc shows that); and the seed's broken setup (privileged pods that
# ask for no GPU, NVIDIA_VISIBLE_DEVICES=all in their env) gets no GPU through the handler and
# every GPU through plain runc.
# Usage: cri_seed.sh LINE       LINE = 1.6 | 1.7 | 2
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_seed.sh 1.6|1.7|2}
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
# shellcheck source=scripts/lib/seed_pods.sh
. "$src/scripts/lib/seed_pods.sh"

# isolated_run NAME CHANNELS: the pods ran, hold different GPUs, each reaches only its own, and
# gpufence-runtime took each grant from one of CHANNELS (docs/trust-model.md: a mount marker
# counts only in a privileged spec).
isolated_run() {
  local name=$1 channels=$2 p own other
  check "$name: both pods ran" test "$(cat "$work/$name.rc")" = 0
  check "$name: the stand-in shows 2 of 2 GPUs allocated" grep -qx "node capacity 2 allocated 2" "$work/$name.out"
  check "$name: its PodResources API shows 2 of 2" grep -qx "podresources allocatable 2 allocated 2" "$work/$name.out"
  for p in 0 1; do
    check "$name: PodResources names pod $p's GPU" grep -qx "podresources default/$name-$p/app nvidia.com/gpu $(awk -v p=$p '$1=="pod" && $2==p && $3=="ids" {print $4}' "$work/$name.out")" "$work/$name.out"
  done
  check "$name: the pods hold different GPUs" test "$(gpu_of "$name" 0)$(gpu_of "$name" 1)" = 01 -o "$(gpu_of "$name" 0)$(gpu_of "$name" 1)" = 10
  for p in 0 1; do
    own=$(gpu_of "$name" $p); other=$((1 - ${own/\?/0}))
    check "$name: pod $p opens its GPU $own" test "$(result "$name" $p /dev/nvidia$own)" = ENXIO
    check "$name: pod $p has no node for GPU $other" test "$(result "$name" $p /dev/nvidia$other)" = ENOENT
    check "$name: pod $p cannot open GPU $other even after mknod" test "$(result "$name" $p /tmp/n$other)" != ENXIO -a -n "$(result "$name" $p /tmp/n$other)"
    check "$name: gpufence-runtime granted pod $p GPU $own, from the kubelet's channels" \
      grep -Eq "channel=($channels) .*granted=${GPU[${own/\?/0}]} " "$work/$name.decisions"
  done
}

echo "== unprivileged pods through the gpufence handler"
run_pods unpriv gpufence 2
isolated_run unpriv "device-specs|cdi-annotations"

# The plugin ran with its default strategies (cdi-annotations too) and wrote its own spec, which
# containerd 1.7/2.x with CDI on resolved the annotation from (docs/containerd-lines.md).
check "the device plugin wrote a valid CDI spec" \
  "$build/bin/gpufence" cdi validate "$plugin_cdi/gpufence.io-gpu.json"

echo "== privileged pods (the seed's) through the gpufence handler"
run_pods priv gpufence 2 --privileged
isolated_run priv "device-specs|cdi-annotations|mount-markers"

echo "== the same privileged pods through the plain runc handler (must leak)"
run_pods leak runc 2 --privileged
check "leak: both pods ran" test "$(cat "$work/leak.rc")" = 0
check "leak: gpufence-runtime was not called" test ! -s "$work/leak.decisions"
for p in 0 1; do
  own=$(gpu_of leak $p); other=$((1 - ${own/\?/0}))
  check "leak: pod $p (plain runc, privileged) reaches GPU $other" test "$(result leak $p /tmp/n$other)" = ENXIO
done

echo "== the seed's broken setup: privileged pods asking for no GPU, NVIDIA_VISIBLE_DEVICES=all in their env"
# Through the gpufence handler the env never counts (docs/trust-model.md): no GPU at all. Through
# plain runc (the handler missing) every GPU is reachable.
run_pods envall gpufence 2 --privileged --gpus 0 --env NVIDIA_VISIBLE_DEVICES=all
run_pods envall-runc runc 2 --privileged --gpus 0 --env NVIDIA_VISIBLE_DEVICES=all
check "envall: both pods ran" test "$(cat "$work/envall.rc")" = 0
check "envall-runc: both pods ran" test "$(cat "$work/envall-runc.rc")" = 0
check "envall: the stand-in allocated nothing" grep -qx "node capacity 2 allocated 0" "$work/envall.out"
check "envall: its PodResources API shows 0 of 2" grep -qx "podresources allocatable 2 allocated 0" "$work/envall.out"
for p in 0 1; do
  for m in 0 1; do
    check "envall: pod $p (gpufence) cannot open GPU $m even after mknod" \
      test "$(result envall $p /tmp/n$m)" != ENXIO -a -n "$(result envall $p /tmp/n$m)"
    check "envall-runc: pod $p (plain runc) reaches GPU $m" test "$(result envall-runc $p /tmp/n$m)" = ENXIO
  done
done
check "envall: gpufence-runtime granted nothing" bash -c "! grep -q 'granted=GPU' '$work/envall.decisions'"

# ---- checks 2b and 3: what the apps see and where they run ----
# The pods of the seed's Deployment, as close as this node allows: the seed-app image (deepstream-
# app stand-in, nvidia-smi -L stand-in), the driver's NVML (the mock, in its driver-like
# visibility: a GPU shows only if its procfs entry is there and its node opens) as a volume with
# the host's /usr for the dynamic tools, the driver procfs copy, the mock's process accounting.

echo "== checks 2b+3: two deepstream-apps through gpufence launch, gpufence handler, unprivileged"
: > "$work/acct/processes"
RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$seed_exec RUN_WHILE=look \
  run_pods apps gpufence 2 "${seed_pod[@]}" --shell "$(seed_shell "$launch")"
seed_isolated apps
echo "== checks 2b+3: the same, privileged (the seed's pods)"
: > "$work/acct/processes"
RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$seed_exec RUN_WHILE=look \
  run_pods apps-priv gpufence 2 --privileged "${seed_pod[@]}" "${host_dev[@]}" --shell "$(seed_shell "$launch")"
seed_isolated apps-priv
sed 's/^/  [apps-priv list] /' "$work/apps-priv.list"

echo "== the seed's broken setup: plain runc, privileged, deepstream-app itself (gpu-id=0), the"
echo "   allocation in NVIDIA_VISIBLE_DEVICES only (NVIDIA's plugin's default envvar strategy)"
: > "$work/acct/processes"
RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$seed_exec RUN_WHILE=look \
  RUN_PLUGIN_ARGS="--device-list-strategy envvar --no-cuda-visible-devices" \
  run_pods apps-seed runc 2 --privileged "${seed_pod[@]}" "${host_dev[@]}" --shell "$(seed_shell "$seed_app")"
check "apps-seed: both pods ran" test "$(cat "$work/apps-seed.rc")" = 0
for p in 0 1; do
  check "apps-seed: pod $p's nvidia-smi -L lists both GPUs" test "$(smi_lines apps-seed $p)" = 2
  check "apps-seed: pod $p's app runs on GPU 0" test "$(app_says apps-seed $p)" = "${GPU[0]}"
done
check "apps-seed: the seed's symptom: gpufence list shows both processes on GPU 0" test "$(procs_on "${GPU[0]}" "$work/apps-seed.list")" = 2
check "apps-seed: and none on GPU 1" test "$(procs_on "${GPU[1]}" "$work/apps-seed.list")" = 0
sed 's/^/  [apps-seed list] /' "$work/apps-seed.list"
sed 's/^/  [apps-seed doctor] /' "$work/apps-seed.doctor"
check "apps-seed: doctor exits 1" test "$(cat "$work/apps-seed.doctor-rc")" = 1
check "apps-seed: doctor names the process on an unallocated GPU" grep -q "gpu.process-on-unallocated" "$work/apps-seed.doctor"
check "apps-seed: doctor names the shared GPU" grep -q "gpu.shared\] 2 containers" "$work/apps-seed.doctor"

echo "gpufence-runtime's decisions:"
sed 's/^/  /' "$work/runtime.log" 2>/dev/null | head -20
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line"; tail -30 "$work/containerd.log"; exit 1; }
echo "containerd $line: all checks passed"
