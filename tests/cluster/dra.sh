#!/usr/bin/env bash
# The seed's node on a real Kubernetes with GPUs through DRA (scripts/lib/cluster.sh: v1.36 on
# containerd LINE, gpufence-nri enforcing): `helm install --set allocation=dra`, then
#   1. gpufence-dra registers with the real kubelet's plugin watcher and publishes the node's
#      ResourceSlice (one device per GPU, its attributes); no device plugin runs, the node shows no
#      nvidia.com/gpu, and the chart's DeviceClass maps that name (extendedResourceName);
#   2. the seed's Deployment, unchanged (`nvidia.com/gpu: 1`, privileged): the real scheduler
#      allocates a GPU of the slice to each pod (its extended-resource claim), the kubelet asks
#      gpufence-dra to prepare it, and each pod opens only its own GPU; a third pod stays Pending;
#   3. a kubelet restart and a gpufence-dra restart with the pods running: nothing is prepared
#      twice (the checkpoint answers), the slice is back, the pods keep their GPUs;
#   4. deleting the pods unprepares their claims; a ResourceClaim with a CEL selector (one GPU's
#      uuid) gets that GPU, and only it opens;
#   5. an XID on GPU 1 (the mock NVML's events file): the slice's device carries a NoSchedule
#      taint and the claim's pod shows the GPU Unhealthy in its status; after the quiet time both
#      are back to healthy; GPU 1 lost: a NoExecute taint, and the pod using it is evicted;
#   6. another vendor's DRA driver (tests/cluster/foreign-dra: NVIDIA's CDI layout, one spec per
#      claim, names per claim) serves the same GPUs: a privileged pod with its claim opens only
#      the claim's GPU, gpufence-nri reading it by the kind the chart listed
#      (installer.gpuCdiKinds), and the doctor joins it the same way;
#   7. helm upgrade to allocation=per-node: the unlabelled node runs the device plugin, and a pod
#      gets its GPU from it; labelled gpufence.io/allocation=dra it runs gpufence-dra instead,
#      and the same pod spec gets its GPU through the DeviceClass;
#   8. helm uninstall: the DeviceClass goes with it.
# Usage: dra.sh LINE     (LINE: 2.3; Kubernetes 1.36 supports containerd 2.2+ only)
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: dra.sh 2.3}
# shellcheck source=scripts/lib/cluster.sh
. "$src/scripts/lib/cluster.sh"
helm=$("$src/deploy/helm/fetch-helm.sh" "$build/tools/helm") || skip "no helm (deploy/helm/fetch-helm.sh)"
cluster_up || exit 1
kubectl create namespace video >/dev/null
# shellcheck source=tests/cluster/pods.sh
. "$src/tests/cluster/pods.sh"
# The current gpufence-dra pod's log, through the kubelet's API (retried: just after a kubelet
# restart it answers nothing for a moment).
dra_log() {
  local out _
  for _ in $(seq 50); do
    out=$(kubectl -n gpufence logs daemonset/gpufence-dra 2>/dev/null) && grep -q "event=dra.serving" <<<"$out" && break
    sleep 0.2
  done
  printf '%s\n' "$out"
}
slice_devices() {
  kubectl get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="gpufence.io")]}{range .spec.devices[*]}{.name}={.attributes.uuid.string}{"\n"}{end}{end}' 2>/dev/null
}
wait_slice() {  # wait_slice COUNT
  local _
  for _ in $(seq 300); do [ "$(slice_devices | grep -c =GPU-)" = "$1" ] && return 0; sleep 0.1; done
  return 1
}
# The foreign driver for step 6 (built by `make test` before the tests: no network here).
fdra=$(bash "$src/tests/cluster/foreign-dra/build.sh") || { fdra_why=$fdra; fdra=""; }
# The driver's NVML takes XIDs from a file beside its config (tools/mock-nvml): the test appends.
python3 - "$driver_lib/mock-nvml.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["events_file"] = "mock-events"
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
: > "$driver_lib/mock-events"

echo "== 1. helm install (allocation dra, enforcement nri)"
t0=$(date +%s.%N)
chart_install --set allocation=dra --set installer.enforcement=nri \
  --set-json 'dra.extraArgs=["--health-recovery=4s"]' \
  --set-json 'installer.gpuCdiKinds=["foreign.example.com/claim"]'
check "helm install succeeds" test $? = 0 || cat "$work/helm-install.log"
chart_ready gpufence-node-installer gpufence-dra
check "gpufence-dra publishes the node's two GPUs in a ResourceSlice" wait_slice 2
cluster_log "installed and the slice published in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
check "each device names its GPU's uuid" test "$(slice_devices | sort)" = "$(printf 'gpu-0=%s\ngpu-1=%s' "${GPU[0]}" "${GPU[1]}")"
check "the kubelet registered it (its plugin watcher called)" grep -q "event=dra.registered" <<<"$(dra_log)"
check "no device plugin: the node advertises no nvidia.com/gpu" test -z "$(allocatable)"
check "no device plugin DaemonSet" bash -c "! '$kbin/kubectl' --kubeconfig '$work/pki/admin.kubeconfig' -n gpufence get daemonset gpufence-device-plugin >/dev/null 2>&1"
# gpufence-dra's own credentials (a token bound to its pod, as the kubelet projects it) write
# only this node's slice: the chart's admission policy, on the real API server.
dra_pod=$(kubectl -n gpufence get pods -l app.kubernetes.io/name=gpufence-dra -o name)
dra_token=$(kubectl -n gpufence create token gpufence-dra --bound-object-kind Pod --bound-object-name "${dra_pod#pod/}" 2>&1)
as_dra() { "$kbin/kubectl" --kubeconfig /dev/null --server https://127.0.0.1:443 \
  --certificate-authority "$work/pki/ca.crt" --token "$dra_token" "$@"; }
foreign_slice() {  # foreign_slice NODE: a slice for NODE's pool, as gpufence-dra would write it
  printf '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"%s-gpufence.io"},"spec":{"driver":"gpufence.io","nodeName":"%s","pool":{"name":"%s","generation":1,"resourceSliceCount":1},"devices":[{"name":"gpu-0"}]}}' "$1" "$1" "$1"
}
out=$(foreign_slice other-node | as_dra create -f - 2>&1)
check "gpufence-dra's token cannot create another node's slice (the admission policy)" \
  grep -q "only the ResourceSlice of the node its pod runs on" <<<"$out"
[ "$failures" = 0 ] || echo "  [as gpufence-dra] $out"
# (Moving its own slice to another node's pool the API server refuses by itself: spec.pool.name
# is immutable.)
check "the DeviceClass maps nvidia.com/gpu" \
  test "$(kubectl get deviceclass gpu.gpufence.io -o jsonpath='{.spec.extendedResourceName}')" = nvidia.com/gpu

echo "== 2. the seed's Deployment, unchanged (nvidia.com/gpu: 1), through DRA"
t0=$(date +%s.%N)
seed_deployment deepstream 2 "" | kubectl apply -f - >/dev/null
check "deepstream: both pods run" wait_running deepstream 2
cluster_log "deepstream (DRA): apply to both pods Running in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
check "the scheduler made one extended-resource claim a pod, allocated from gpufence.io" \
  test "$(kubectl -n video get resourceclaims -o jsonpath='{range .items[*]}{.status.allocation.devices.results[0].driver}{"\n"}{end}' | grep -c gpufence.io)" = 2
check_isolated deepstream 01
prepared=$(dra_log | grep -c "event=dra.prepared ")
check "gpufence-dra prepared the two claims ($prepared)" test "$prepared" = 2
dra_pid=$(pgrep -f "^/usr/local/bin/gpufence-dra" | head -1)
[ -n "$dra_pid" ] && cluster_log "gpufence-dra RSS $(awk '/^VmRSS/ {print $2, $3}' "/proc/$dra_pid/status") with two claims prepared"
pending=$(scheduler_refusal deepstream)
check "a third pod stays Pending, the scheduler saying why" test -n "$pending"
echo "  [scheduler] ${pending:0:300}"

echo "== 3. kubelet and gpufence-dra restarts with the pods running"
slice_uid() { kubectl get resourceslice "$cluster_node-gpufence.io" -o jsonpath='{.metadata.uid}' 2>/dev/null; }
uid0=$(slice_uid)
restart_kubelet
check "the node is Ready again" wait_node_ready
for _ in $(seq 300); do u=$(slice_uid); [ -n "$u" ] && [ "$u" != "$uid0" ] && break; sleep 0.1; done
check "the kubelet deleted the node's slice as it started, and gpufence-dra made it again" \
  test -n "$(slice_uid)" -a "$(slice_uid)" != "$uid0"
check "with both GPUs" wait_slice 2
anew=$(dra_log | grep -c "event=dra.prepared ")
check "nothing was prepared anew (a repeat is answered from the checkpoint: $(dra_log | grep -c "event=dra.prepared_again"))" \
  test "$anew" = 2
[ "$anew" = 2 ] || { dra_log | grep "event=dra\." | cut -c1-200; kubectl -n video get pods -o wide; kubectl -n video get resourceclaims; }
old_dra=$(kubectl -n gpufence get pods -l app.kubernetes.io/name=gpufence-dra -o name)
kubectl -n gpufence delete $old_dra --wait=true >/dev/null
check "the recreated gpufence-dra pod is ready" rollout_ready gpufence-dra
check "its slice is there" wait_slice 2
check "both pods kept running" test "$(pods_of deepstream | wc -l)" = 2
check "the new gpufence-dra read the two prepared claims back" grep -q 'event=dra.checkpoint_loaded claims=2' <<<"$(dra_log)"
check "and prepared nothing anew" test "$(dra_log | grep -c "event=dra.prepared ")" = 0
check_isolated deepstream 01
# The doctor joins what the kubelet allocated through DRA (PodResources' DynamicResource) with
# what each container opens: no false alarm on a DRA node, gpufence-dra's own pod included.
doctor_out=$("$build/bin/gpufence" --nvml-library $driver_lib/libnvidia-ml.so.1 doctor \
  --kubeconfig "$work/pki/admin.kubeconfig" --node-name "$cluster_node" --system-namespace gpufence --probe 2>&1)
doctor_rc=$?
check "the doctor finds no error on the DRA node (exit $doctor_rc)" test "$doctor_rc" = 0
check "it reads each pod's GPU from its DRA claim" \
  test "$(grep -cE "video/deepstream-[^ ]* \[privileged\]: allocated GPU([01]) \| can open GPU\1 \(probe\)" <<<"$doctor_out")" = 2
[ "$doctor_rc" = 0 ] || echo "$doctor_out" | sed 's/^/  [doctor] /'

echo "== 4. a ResourceClaim with a CEL selector: GPU 1 by its uuid"
kubectl -n video delete deployment deepstream --wait=true >/dev/null
for _ in $(seq 300); do [ -z "$(kubectl -n video get pods -o name)" ] && break; sleep 0.1; done
for _ in $(seq 300); do grep -q "event=dra.unprepared" <<<"$(dra_log)" && break; sleep 0.1; done
check "deleting the pods unprepared their claims (checkpointed by the old pod, read back)" \
  grep -q "event=dra.unprepared" <<<"$(dra_log)"
kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: by-uuid, namespace: video}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.gpufence.io
        selectors:
        - cel: {expression: 'device.attributes["gpufence.io"].uuid == "${GPU[1]}"'}
YAML
seed_deployment chosen 1 "" by-uuid | kubectl apply -f - >/dev/null
check "chosen: its pod runs" wait_running chosen 1
check "chosen: the claim got GPU 1" \
  test "$(kubectl -n video get resourceclaim by-uuid -o jsonpath='{.status.allocation.devices.results[0].device}')" = gpu-1
check_isolated chosen 1
echo "== 5. an XID on GPU 1: tainted, unhealthy in its pod's status, then recovered"
# The kubelet puts a claim's health into the status of containers that name claims
# (resources.claims: cm/dra UpdateAllocatedResourcesStatus), so the claim's pod shows it; a pod
# with only an extended-resource claim does not.
taint_of() {  # taint_of DEVICE: effect=value of its taints
  kubectl get resourceslice "$cluster_node-gpufence.io" -o jsonpath="{range .spec.devices[?(@.name==\"$1\")].taints[*]}{.effect}={.value}{end}" 2>/dev/null
}
wait_taint() {  # wait_taint DEVICE WANT
  local _
  for _ in $(seq 150); do [ "$(taint_of "$1")" = "$2" ] && return 0; sleep 0.1; done
  return 1
}
echo '{"gpu": 1, "xid": 48}' >> "$driver_lib/mock-events"
check "the slice's gpu-1 carries the NoSchedule taint of XID 48" wait_taint gpu-1 NoSchedule=xid-48
check "gpu-0 stays untainted" test -z "$(taint_of gpu-0)"
p1=$(pods_of chosen | head -1)
p1=${p1#pod/}
health=""
for _ in $(seq 150); do
  health=$(kubectl -n video get pod "$p1" -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus[*].resources[*].health}' 2>/dev/null)
  [ "$health" = Unhealthy ] && break; sleep 0.1
done
check "chosen's pod shows its GPU Unhealthy in its status (the health stream)" test "$health" = Unhealthy
check "after the quiet time (--health-recovery) the taint is gone" wait_taint gpu-1 ""
for _ in $(seq 150); do
  health=$(kubectl -n video get pod "$p1" -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus[*].resources[*].health}' 2>/dev/null)
  [ "$health" = Healthy ] && break; sleep 0.1
done
check "and the pod shows it Healthy again" test "$health" = Healthy
# GPU 1 falls off the bus: NoExecute, and the controller manager's device taint eviction
# (DRADeviceTaints, on by default in 1.36) evicts the pod using it.
uid1=$(kubectl -n video get pod "$p1" -o jsonpath='{.metadata.uid}')
echo '{"gpu": 1, "lost": true}' >> "$driver_lib/mock-events"
check "a lost GPU's device carries a NoExecute taint" wait_taint gpu-1 NoExecute=lost
evicted=""
for _ in $(seq 300); do
  u=$(kubectl -n video get pod "$p1" -o jsonpath='{.metadata.uid}{.metadata.deletionTimestamp}' 2>/dev/null)
  [ "$u" != "$uid1" ] && { evicted=yes; break; }
  sleep 0.1
done
check "the pod using it is evicted" test "$evicted" = yes
echo '{"gpu": 1, "lost": false}' >> "$driver_lib/mock-events"
check "the GPU answers again: untainted" wait_taint gpu-1 ""

kubectl -n video delete deployment chosen --wait=true >/dev/null
kubectl -n video delete resourceclaim by-uuid --wait=true >/dev/null

echo "== 6. another DRA driver's claim, enforced by its listed CDI kind"
check "the installer listed the foreign kind in runtime.toml ([cdi] gpu_kinds)" \
  grep -q '^gpu_kinds = \["foreign.example.com/claim"\]' /etc/gpufence/runtime.toml
if [ -z "$fdra" ]; then
  echo "SKIP: step 6 (another DRA driver's claim): $fdra_why"
else
  "$fdra" --kubeconfig "$work/pki/admin.kubeconfig" --node-name "$cluster_node" > "$work/foreign-dra.log" 2>&1 &
  fdra_pid=$!
  foreign_devices() {
    kubectl get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="foreign.example.com")]}{range .spec.devices[*]}{.name}{"\n"}{end}{end}' 2>/dev/null
  }
  for _ in $(seq 300); do [ "$(foreign_devices | grep -c gpu-)" = 2 ] && break; sleep 0.1; done
  check "the foreign driver publishes the node's two GPUs" test "$(foreign_devices | grep -c gpu-)" = 2
  kubectl apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.foreign.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "foreign.example.com"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: by-foreign, namespace: video}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.foreign.example.com}
YAML
  seed_deployment foreign 1 "" by-foreign | kubectl apply -f - >/dev/null
  check "foreign: its privileged pod runs" wait_running foreign 1
  fdev=$(kubectl -n video get resourceclaim by-foreign -o jsonpath='{.status.allocation.devices.results[0].driver}/{.status.allocation.devices.results[0].device}')
  check "the claim was allocated from the foreign driver ($fdev)" grep -qE '^foreign.example.com/gpu-[01]$' <<<"$fdev"
  fuid=$(kubectl -n video get resourceclaim by-foreign -o jsonpath='{.metadata.uid}')
  fpod=$(pods_of foreign | head -1)
  check "containerd injected the claim's own CDI spec (its env)" \
    test "$(kubectl -n video exec "${fpod#pod/}" -- sh -c 'echo $FOREIGN_CLAIM' 2>&1)" = "$fuid"
  check_isolated foreign "${fdev##*gpu-}"
  # The doctor resolves the claim through the same listing (runtime.toml) and spec.
  doctor_out=$("$build/bin/gpufence" --nvml-library $driver_lib/libnvidia-ml.so.1 doctor \
    --kubeconfig "$work/pki/admin.kubeconfig" --node-name "$cluster_node" --system-namespace gpufence --probe 2>&1)
  doctor_rc=$?
  check "the doctor finds no error with the foreign claim's pod (exit $doctor_rc)" test "$doctor_rc" = 0
  check "it reads the pod's GPU from the foreign claim" \
    grep -qE "video/foreign-[^ ]* \[privileged\]: allocated GPU${fdev##*gpu-} \| can open GPU${fdev##*gpu-} \(probe\)" <<<"$doctor_out"
  [ "$doctor_rc" = 0 ] || echo "$doctor_out" | sed 's/^/  [doctor] /'
  kubectl -n video delete deployment foreign --wait=true >/dev/null
  for _ in $(seq 300); do [ -z "$(kubectl -n video get pods -o name)" ] && break; sleep 0.1; done
  kubectl -n video delete resourceclaim by-foreign --wait=true >/dev/null
  for _ in $(seq 100); do grep -q "foreign-dra: unprepared" "$work/foreign-dra.log" && break; sleep 0.1; done
  check "deleting the pod unprepared the foreign claim (its spec removed)" \
    test ! -e "/var/run/cdi/foreign.example.com-claim_$fuid.json"
  kill "$fdra_pid" 2>/dev/null; wait "$fdra_pid" 2>/dev/null
  kubectl delete deviceclass gpu.foreign.example.com >/dev/null
  [ "$failures" = 0 ] || { echo "--- foreign-dra.log"; tail -20 "$work/foreign-dra.log"; }
fi

dra_log > "$work/dra.log"
echo "== 7. allocation=per-node: the node's label moves it between the backends"
ds_pods() { kubectl -n gpufence get pods -l "app.kubernetes.io/name=$1" -o name 2>/dev/null | wc -l; }
wait_ds_pods() {  # wait_ds_pods NAME COUNT
  local _
  for _ in $(seq 600); do [ "$(ds_pods "$1")" = "$2" ] && return 0; sleep 0.1; done
  return 1
}
claims_of() { kubectl -n video get resourceclaims -o name 2>/dev/null | wc -l; }
"$helm" upgrade gpufence "$src/deploy/helm/gpufence" --kubeconfig "$work/pki/admin.kubeconfig" \
  --namespace gpufence --reuse-values --set allocation=per-node --wait --timeout 240s > "$work/helm-upgrade.log" 2>&1
check "helm upgrade to allocation=per-node succeeds" test $? = 0 || tail -5 "$work/helm-upgrade.log"
check "the unlabelled node runs the device plugin" rollout_ready gpufence-device-plugin
check "and no gpufence-dra" wait_ds_pods gpufence-dra 0
check "the node advertises nvidia.com/gpu: 2 from the device plugin" wait_allocatable 2
seed_deployment pool 1 "" | kubectl apply -f - >/dev/null
check "pool (device plugin): its pod runs" wait_running pool 1
check "pool: allocated by the device plugin (no claim)" test "$(claims_of)" = 0
kubectl -n video delete deployment pool --wait=true >/dev/null
for _ in $(seq 300); do [ -z "$(kubectl -n video get pods -o name)" ] && break; sleep 0.1; done
kubectl label node "$cluster_node" gpufence.io/allocation=dra --overwrite >/dev/null
check "labelled dra: the device plugin's pod leaves" wait_ds_pods gpufence-device-plugin 0
check "gpufence-dra's arrives" rollout_ready gpufence-dra
check "and publishes the node's slice" wait_slice 2
cluster_log "after the move: allocatable nvidia.com/gpu='$(allocatable)', capacity='$(kubectl get node "$cluster_node" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')'"
seed_deployment pool 1 "" | kubectl apply -f - >/dev/null
check "pool (DRA): the same pod spec runs" wait_running pool 1
check "pool: allocated through the DeviceClass (an extended-resource claim)" test "$(claims_of)" = 1
kubectl -n video delete deployment pool --wait=true >/dev/null
kubectl label node "$cluster_node" gpufence.io/allocation- >/dev/null

echo "== 8. helm uninstall"
chart_uninstall
check "the DeviceClass is gone" bash -c "! '$kbin/kubectl' --kubeconfig '$work/pki/admin.kubeconfig' get deviceclass gpu.gpufence.io >/dev/null 2>&1"

[ "$failures" = 0 ] || {
  echo "$failures check(s) failed on containerd $line"
  echo "--- gpufence-dra (the last pod)"; tail -30 "$work/dra.log"
  for f in kubelet containerd; do echo "--- $f.log (errors)"; grep -E '^E[0-9]{4}|level=error' "$work/$f.log" | tail -15; done
  exit 1
}
echo "containerd $line: the seed's pods through DRA on a real Kubernetes: all checks passed"
