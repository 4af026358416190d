# Shared by the cluster tier's scripts (sourced after scripts/lib/cluster.sh and cluster_up): the
# chart's install and uninstall, the seed's Deployment and what each of its pods can open.

# chart_install HELM_ARG...: the gpufence image (scripts/image/assemble.py) imported into the
# node's containerd, then `helm install` of the chart with this node's settings (containerd, the
# driver's root, the image offline, containerd restarted through this test's restart command),
# the caller's after them; helm's output in $work/helm-install.log. Needs $helm.
chart_install() {
  python3 "$src/scripts/image/assemble.py" oci "$build" "$work/gpufence.tar" > /dev/null &&
    "$cbin/ctr" -n k8s.io images import "$work/gpufence.tar" >/dev/null || { echo "cannot import the gpufence image"; return 1; }
  "$helm" install gpufence "$src/deploy/helm/gpufence" --kubeconfig "$work/pki/admin.kubeconfig" \
    --namespace gpufence --create-namespace --set distribution=containerd \
    --set driver.root="$driver_root" --set image.pullPolicy=Never \
    --set-json "installer.extraArgs=[\"--host-pid=$$\",\"--restart-command=$work/restart-containerd.sh\"]" \
    "$@" --wait --timeout 240s > "$work/helm-install.log" 2>&1
}
# chart_ready DAEMONSET...: a check each that its pod is ready (helm's --wait counts a DaemonSet
# ready with maxUnavailable pods missing: on one node, with none); a failing one's pods and logs.
chart_ready() {
  local ds f0
  for ds in "$@"; do
    f0=$failures
    check "$ds's pod is ready" rollout_ready "$ds"
    [ "$failures" = "$f0" ] || { kubectl -n gpufence get pods -o wide; kubectl -n gpufence logs "daemonset/$ds" --tail 30; }
  done
}
# chart_uninstall: `helm uninstall`, checked; its output in $work/helm-uninstall.log.
chart_uninstall() {
  "$helm" uninstall gpufence --kubeconfig "$work/pki/admin.kubeconfig" --namespace gpufence --wait --timeout 120s > "$work/helm-uninstall.log" 2>&1
  check "helm uninstall succeeds" test $? = 0 || tail -5 "$work/helm-uninstall.log"
}

# seed_deployment NAME REPLICAS RUNTIME_CLASS [CLAIM]: the seed's Deployment (privileged, one GPU
# a pod, the seed's own deepstream-app with gpu-id=0), with the driver's NVML as it sees it (the
# mock in its driver visibility: a GPU shows only when its node opens) and the tools as volumes.
# With CLAIM, the GPU comes from that ResourceClaim instead of an nvidia.com/gpu limit.
seed_deployment() {
  local name=$1 replicas=$2 rc=$3 claim=${4:-} gpu='resources: {limits: {nvidia.com/gpu: 1}}'
  [ -n "$claim" ] && gpu='resources: {claims: [{name: gpu}]}'
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: $name, namespace: video}
spec:
  replicas: $replicas
  selector: {matchLabels: {app: $name}}
  template:
    metadata: {labels: {app: $name}}
    spec:
      ${rc:+runtimeClassName: $rc}
      ${claim:+resourceClaims: [{name: gpu, resourceClaimName: $claim\}]}
      terminationGracePeriodSeconds: 0
      enableServiceLinks: false
      containers:
      - name: deepstream
        image: $GF_SEED_APP_IMAGE
        imagePullPolicy: Never
        command: ["/bin/sh", "-c", "deepstream-app -c /app/ds.txt > /tmp/app.out 2>&1"]
        env:
        - {name: PATH, value: /bin:/opt/gpufence/bin}
        - {name: LD_LIBRARY_PATH, value: /opt/driver}
        - {name: MOCK_NVML_CONFIG, value: /etc/mock-nvml/mock-nvml.json}
        - {name: MOCK_NVML_VISIBILITY, value: driver}
        - {name: MOCK_NVML_PROCFS_DIR, value: /fakeproc/gpus}
        - {name: MOCK_NVML_PROCESSES, value: /run/mock-nvml/processes}
        $gpu
        securityContext: {privileged: true}
        volumeMounts:
        - {name: usr, mountPath: /usr, readOnly: true}
        - {name: tools, mountPath: /opt/gpufence/bin, readOnly: true}
        - {name: driver, mountPath: /opt/driver, readOnly: true}
        - {name: driver, mountPath: /etc/mock-nvml, readOnly: true}
        - {name: acct, mountPath: /run/mock-nvml}
        - {name: procfs, mountPath: /fakeproc/gpus, readOnly: true}
      volumes:
      - {name: usr, hostPath: {path: /usr}}
      - {name: tools, hostPath: {path: $build/bin}}
      - {name: driver, hostPath: {path: $driver_lib}}
      - {name: acct, emptyDir: {}}
      - {name: procfs, hostPath: {path: $node/fakeproc/gpus}}
YAML
}
# pods_of NAME: the Deployment's pods, Running, sorted.
pods_of() { kubectl -n video get pods -l "app=$1" --field-selector=status.phase=Running -o name 2>/dev/null | sort; }
wait_running() {  # wait_running NAME COUNT
  local _
  for _ in $(seq 600); do [ "$(pods_of "$1" | wc -l)" = "$2" ] && return 0; sleep 0.1; done
  kubectl -n video get pods -o wide
  kubectl -n video get pods -o jsonpath='{range .items[*]}{.metadata.name}: {.status.containerStatuses[*].state.waiting.message}{"\n"}{end}' | cut -c1-600
  return 1
}
allocatable() { kubectl get node "$cluster_node" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}' 2>/dev/null; }
wait_allocatable() {  # wait_allocatable N [TENTHS]
  local _
  for _ in $(seq "${2:-600}"); do [ "$(allocatable)" = "$1" ] && return 0; sleep 0.1; done
  return 1
}
# look POD: inside the pod, what opens (the probe's errno oracle: ENXIO allowed, EPERM denied,
# ENOENT absent), also after mknod, what NVML lists, where the app runs, its NVIDIA_VISIBLE_DEVICES.
look() {
  kubectl -n video exec "$1" -- sh -c '
    gpufence-probe /dev/nvidia0 /dev/nvidia1
    mknod /tmp/n0 c 195 0 2>/dev/null; mknod /tmp/n1 c 195 1 2>/dev/null; gpufence-probe /tmp/n0 /tmp/n1
    echo "smi $(gpufence-smi 2>/dev/null | wc -l)"
    i=0; while [ $i -lt 100 ] && ! grep -q "running on" /tmp/app.out 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    echo "app $(sed -n "s/.*running on \([^ ]*\).*/\1/p" /tmp/app.out)"
    echo "nvd ${NVIDIA_VISIBLE_DEVICES:-unset}"' 2>&1
}
# scheduler_refusal NAME: the Deployment scaled to 3 pods on a two-GPU node, the scheduler's
# FailedScheduling message for the third printed (empty when none came in 20 s), then back to 2.
scheduler_refusal() {
  local pending=""
  kubectl -n video scale deployment "$1" --replicas 3 >/dev/null
  for _ in $(seq 200); do
    pending=$(kubectl -n video get events --field-selector reason=FailedScheduling -o jsonpath='{.items[*].message}' 2>/dev/null)
    [ -n "$pending" ] && break; sleep 0.1
  done
  kubectl -n video scale deployment "$1" --replicas 2 >/dev/null
  printf '%s' "$pending"
}
rollout_ready() { kubectl -n gpufence rollout status daemonset "$1" --timeout 120s >/dev/null; }
field() { awk -v k="$2" '$1 == k {print $2}' <<<"$1"; }
gpu_index() { case $1 in "${GPU[0]}") echo 0 ;; "${GPU[1]}") echo 1 ;; *) echo "?" ;; esac; }
# check_isolated DEPLOYMENT WANT: each Running pod opens only its own GPU (by node and after
# mknod) and its app runs there; WANT is the GPU indexes the pods must have, sorted ("01", "1").
check_isolated() {
  local d=$1 want=$2 gpus="" p out own other f0
  for p in $(pods_of "$d"); do
    out=$(look "${p#pod/}")
    f0=$failures
    own=$(gpu_index "$(field "$out" app)")
    gpus+=$own
    other=$((1 - ${own/\?/0}))
    check "$d: $p's app runs on a GPU of the node ($own)" test "$own" != "?"
    check "$d: $p's NVML lists one GPU" test "$(field "$out" smi)" = 1
    check "$d: $p opens its own GPU $own" test "$(field "$out" "/tmp/n$own")" = ENXIO
    check "$d: $p cannot open GPU $other, by node or after mknod" \
      test "$(field "$out" "/dev/nvidia$other")" != ENXIO -a "$(field "$out" "/tmp/n$other")" != ENXIO -a -n "$(field "$out" "/tmp/n$other")"
    [ "$failures" = "$f0" ] || sed "s|^|  [$p] |" <<<"$out"
  done
  check "$d: the pods have GPU(s) $want" test "$(echo "$gpus" | grep -o . | sort | tr -d '\n')" = "$want"
}
