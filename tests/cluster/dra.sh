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
#   5. helm uninstall: the slice and the DeviceClass go with it.
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
dra_log() { kubectl -n gpufence logs daemonset/gpufence-dra 2>/dev/null; }
slice_devices() {
  kubectl get resourceslices -o jsonpath='{range .items[?(@.spec.driver=="gpufence.io")]}{range .spec.devices[*]}{.name}={.attributes.uuid.string}{"\n"}{end}{end}' 2>/dev/null
}
wait_slice() {  # wait_slice COUNT
  local _
  for _ in $(seq 300); do [ "$(slice_devices | grep -c =GPU-)" = "$1" ] && return 0; sleep 0.1; done
  return 1
}
echo "== 1. helm install (allocation dra, enforcement nri)"
python3 "$src/scripts/image/assemble.py" oci "$build" "$work/gpufence.tar" > /dev/null &&
  "$cbin/ctr" -n k8s.io images import "$work/gpufence.tar" >/dev/null || { echo "cannot import the gpufence image"; exit 1; }
t0=$(date +%s.%N)
"$helm" install gpufence "$src/deploy/helm/gpufence" --kubeconfig "$work/pki/admin.kubeconfig" \
  --namespace gpufence --create-namespace --set distribution=containerd --set allocation=dra \
  --set installer.enforcement=nri --set driver.root=$driver_root --set image.pullPolicy=Never \
  --set-json "installer.extraArgs=[\"--host-pid=$$\",\"--restart-command=$work/restart-containerd.sh\"]" \
  --wait --timeout 240s > "$work/helm-install.log" 2>&1
check "helm install succeeds" test $? = 0 || cat "$work/helm-install.log"
for ds in gpufence-node-installer gpufence-dra; do
  f0=$failures
  check "$ds's pod is ready" rollout_ready "$ds"
  [ "$failures" = "$f0" ] || { kubectl -n gpufence get pods -o wide; kubectl -n gpufence logs "daemonset/$ds" --tail 30; }
done
check "gpufence-dra publishes the node's two GPUs in a ResourceSlice" wait_slice 2
cluster_log "installed and the slice published in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
check "each device names its GPU's uuid" test "$(slice_devices | sort)" = "$(printf 'gpu-0=%s\ngpu-1=%s' "${GPU[0]}" "${GPU[1]}")"
check "the kubelet registered it (its plugin watcher called)" grep -q "event=dra.registered" <<<"$(dra_log)"
check "no device plugin: the node advertises no nvidia.com/gpu" test -z "$(allocatable)"
check "no device plugin DaemonSet" bash -c "! '$kbin/kubectl' --kubeconfig '$work/pki/admin.kubeconfig' -n gpufence get daemonset gpufence-device-plugin >/dev/null 2>&1"
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
kubectl -n video scale deployment deepstream --replicas 3 >/dev/null
pending=""
for _ in $(seq 200); do
  pending=$(kubectl -n video get events --field-selector reason=FailedScheduling -o jsonpath='{.items[*].message}' 2>/dev/null)
  [ -n "$pending" ] && break; sleep 0.1
done
check "a third pod stays Pending, the scheduler saying why" test -n "$pending"
echo "  [scheduler] ${pending:0:300}"
kubectl -n video scale deployment deepstream --replicas 2 >/dev/null

echo "== 3. kubelet and gpufence-dra restarts with the pods running"
slice_uid() { kubectl get resourceslice "$cluster_node-gpufence.io" -o jsonpath='{.metadata.uid}' 2>/dev/null; }
uid0=$(slice_uid)
restart_kubelet
check "the node is Ready again" wait_node_ready
for _ in $(seq 300); do u=$(slice_uid); [ -n "$u" ] && [ "$u" != "$uid0" ] && break; sleep 0.1; done
check "the kubelet deleted the node's slice as it started, and gpufence-dra made it again" \
  test -n "$(slice_uid)" -a "$(slice_uid)" != "$uid0"
check "with both GPUs" wait_slice 2
check "nothing was prepared anew (a repeat is answered from the checkpoint: $(dra_log | grep -c "event=dra.prepared_again"))" \
  test "$(dra_log | grep -c "event=dra.prepared ")" = 2
old_dra=$(kubectl -n gpufence get pods -l app.kubernetes.io/name=gpufence-dra -o name)
kubectl -n gpufence delete $old_dra --wait=true >/dev/null
check "the recreated gpufence-dra pod is ready" rollout_ready gpufence-dra
check "its slice is there" wait_slice 2
check "both pods kept running" test "$(pods_of deepstream | wc -l)" = 2
check "the new gpufence-dra read the two prepared claims back" grep -q 'event=dra.checkpoint_loaded claims=2' <<<"$(dra_log)"
check "and prepared nothing anew" test "$(dra_log | grep -c "event=dra.prepared ")" = 0
check_isolated deepstream 01

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
kubectl -n video delete deployment chosen --wait=true >/dev/null
kubectl -n video delete resourceclaim by-uuid --wait=true >/dev/null

dra_log > "$work/dra.log"
echo "== 5. helm uninstall"
"$helm" uninstall gpufence --kubeconfig "$work/pki/admin.kubeconfig" --namespace gpufence --wait --timeout 120s > "$work/helm-uninstall.log" 2>&1
check "helm uninstall succeeds" test $? = 0
check "the DeviceClass is gone" bash -c "! '$kbin/kubectl' --kubeconfig '$work/pki/admin.kubeconfig' get deviceclass gpu.gpufence.io >/dev/null 2>&1"

[ "$failures" = 0 ] || {
  echo "$failures check(s) failed on containerd $line"
  echo "--- gpufence-dra (the last pod)"; tail -30 "$work/dra.log"
  for f in kubelet containerd; do echo "--- $f.log (errors)"; grep -E '^E[0-9]{4}|level=error' "$work/$f.log" | tail -15; done
  exit 1
}
echo "containerd $line: the seed's pods through DRA on a real Kubernetes: all checks passed"
