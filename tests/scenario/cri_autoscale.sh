#!/usr/bin/env bash
# The seed's check 4, "pods added by the autoscaler are isolated too", through containerd's CRI:
# gpufence-test-cluster plays one node's API server, ReplicaSet controller, scheduler and kubelet
# (tools/test-kubelet/cluster_main.cpp) with the real gpufence-device-plugin registered, on a
# private containerd of the given line (cri_node.sh); `gpufence autoscale --once` scales the
# Deployment video/deepstream step by step as the streams ConfigMap grows. See
# docs/containerd-lines.md, "The cluster mode".
# Checks, per flow (on line 1.6 the first with two other teams' pods Pending that no node can
# take, which must neither count as demand nor freeze scaling, and are named in Events): demand
# for 1 pod -> one replica, run through the handler, that sees only its
# own GPU; demand for 2 -> a second replica on the other GPU, only its own; demand for 5 -> the
# autoscaler stays at 2 (0 free GPUs), says so and posts ScaleUpCappedByGpus; a hand-made scale to
# 3 (GET + PUT of /scale with its resourceVersion, as kubectl scale does) -> the third pod stays
# Pending/Unschedulable, is never admitted, never gets a sandbox, the autoscaler does not add more;
# a scale back to 2 deletes that Pending pod, not a running one. Flows: the gpufence handler with
# unprivileged and with privileged (the seed's) pods; and privileged pods through plain runc, where
# the second replica must reach the first one's GPU, so the test fails if gpufence-runtime is
# replaced by runc (GF_CRI_HANDLER_BINARY=$(command -v runc) shows that).
# With MODE nri (containerd 2.3): no runtimeClassName at all; gpufence-nri, connected to
# containerd's NRI socket, enforces the allocation in the replicas the autoscaler adds, privileged
# ones included (docs/nri.md); the same Deployment with the plugin stopped leaks.
# Usage: cri_autoscale.sh LINE [MODE]       LINE = 1.6 | 1.7 | 2 | 2.3, MODE = handler (default) | nri
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_autoscale.sh 1.6|1.7|2|2.3 [handler|nri]}
mode=${2:-handler}
if [ "$mode" = nri ]; then
  gf_line_has "$line" nri-required || { echo "SKIP: privileged replicas are narrowed through NRI from v0.10 (containerd 2.2) on"; exit 77; }
  [ -x "$build/bin/gpufence-nri" ] || { echo "SKIP: $build/bin/gpufence-nri is not built"; exit 77; }
  GF_CRI_NRI=1
fi
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
[ -x "$build/bin/gpufence-test-cluster" ] || skip "$build/bin/gpufence-test-cluster is not built"
command -v python3 >/dev/null || skip "python3 (the test's API client) is not installed"

# --- The cluster stand-in and a client of its API ---

# start_cluster NAME RUNTIME_CLASS [gpufence-test-cluster option...]: the stand-in first, the
# device plugin once kubelet.sock is there (as run_pods does), until the API answers.
start_cluster() {
  local name=$1 class=$2 dp=$work/dp-$1
  shift 2
  mkdir -p "$dp"
  seen=$({ wc -l < "$work/runtime.log"; } 2>/dev/null || echo 0)
  kubeconfig=$work/$name.kubeconfig
  "$build/bin/gpufence-test-cluster" --plugin-dir "$dp" --runtime-endpoint "$sock" \
    --runtime-class "$class" --image "$GF_APP_IMAGE" --cgroup-parent "/$cgroup" \
    --kubeconfig "$kubeconfig" --stop-file "$work/$name.stop" --limit 120 "$@" \
    -- /bin/sh -c "$probe" > "$work/$name.out" 2>&1 &
  kubelet_pid=$!
  for _ in $(seq 100); do [ -S "$dp/kubelet.sock" ] && break; sleep 0.05; done
  "$build/bin/gpufence-device-plugin" --plugin-dir "$dp" --host-root "$node" --dev-root "$node" \
    --log-file "$work/device-plugin-$name.log" "${plugin_args[@]}" &
  plugin_pid=$!
  wait_for "$name" '^api '
  api=$(awk '$1 == "api" {print $2; exit}' "$work/$name.out")
  token=$(awk '$1 == "token:" {print $2; exit}' "$kubeconfig")
}
# stop_cluster NAME: every pod torn down through the CRI; gpufence-runtime's decisions meanwhile
# in $work/NAME.decisions.
stop_cluster() {
  local name=$1
  touch "$work/$name.stop"
  end_pods "$name" "$seen"
  grep -oE 'channel=[a-z-]+ privileged=[a-z]+ .*granted=[^ ]+' "$work/$name.decisions" |
    awk -v n="$name" '$NF != "granted=\"\"" {print "  [" n " gpufence-runtime] " $1, $2, $NF}'
}
# wait_for NAME REGEX: until the stand-in has printed a matching line (bounded: 30 s).
wait_for() {
  for _ in $(seq 300); do
    grep -Eq "$2" "$work/$1.out" && return 0
    kill -0 "$kubelet_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "  (no line matching '$2' from the $1 stand-in)"
  return 1
}
# kube get PATH | kube pods | kube edit PATH PYTHON: the API as kubectl uses it. edit reads the
# object, applies the Python statement to `o`, PUTs it back with the resourceVersion read, and
# on 409 (someone wrote in between) reads again, as kubectl scale and edit retry.
kube() {
  python3 - "$api" "$token" "$@" <<'PY'
import json, sys, urllib.error, urllib.request
api, token, verb = sys.argv[1:4]
def call(method, path, body=None):
    req = urllib.request.Request(api + path, method=method, data=body, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
if verb == "get":
    print(json.dumps(call("GET", sys.argv[4])))
elif verb == "pods":  # name phase node PodScheduled-status reason, one line a pod
    for p in call("GET", "/api/v1/pods")["items"]:
        cond = {c["type"]: c for c in p["status"].get("conditions", [])}.get("PodScheduled", {})
        print(p["metadata"]["name"], p["status"].get("phase", "-"), p["spec"].get("nodeName") or "-",
              cond.get("status", "-"), cond.get("reason", "-"))
elif verb == "edit":
    path = sys.argv[4]
    for _ in range(5):
        o = call("GET", path)
        exec(sys.argv[5])
        try:
            call("PUT", path, json.dumps(o).encode())
            sys.exit(0)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                sys.exit(f"PUT {path}: {e.code} {e.read().decode()}")
    sys.exit(f"PUT {path}: 409 five times")
PY
}
set_streams() { kube edit /api/v1/namespaces/video/configmaps/streams "o['data']['count'] = '$1'"; }
kubectl_scale() { kube edit /apis/apps/v1/namespaces/video/deployments/deepstream/scale "o['spec']['replicas'] = $1"; }
# autoscale NAME STEP: one reconcile of the real autoscaler, 8 streams a pod; output in
# $work/NAME.autoscale-STEP.
autoscale() {
  "$build/bin/gpufence" autoscale --kubeconfig "$kubeconfig" --deployment video/deepstream \
    --streams-configmap video/streams:count --streams-per-pod 8 --max 10 --once \
    --no-leader-election > "$work/$1.autoscale-$2" 2>&1
  echo $? >> "$work/$1.autoscale-$2"
  sed "s/^/  [$1 autoscale $2] /" "$work/$1.autoscale-$2"
}

# --- What the stand-in printed ---

pod_n() { awk -v n="$2" '$1 == "pod" && $3 == "created" && ++i == n {print $2}' "$work/$1.out"; }
result() { awk -v p="$2" -v f="$3" '$1=="pod" && $2==p && $3=="exec" && $4==f {print $5}' "$work/$1.out"; }
gpu_of() {
  local id; id=$(awk -v p="$2" '$1=="pod" && $2==p && $3=="ids" {print $4}' "$work/$1.out")
  case $id in "${GPU[0]}") echo 0 ;; "${GPU[1]}") echo 1 ;; *) echo "?" ;; esac
}
said() { grep -Eq "$2" "$work/$1.out"; }
never() { ! grep -Eq "$2" "$work/$1.out"; }
# sandboxes_of POD: containerd's own count of containers (sandbox and app) labelled with that pod.
sandboxes_of() {
  "${ctr[@]}" -n k8s.io containers ls -q "labels.\"io.kubernetes.pod.name\"==$1" 2>/dev/null | grep -c .
}

# tenant_pod NAME GPUS [SPEC_FIELDS]: another team's pod as JSON, for --foreign-pod.
tenant_pod() {
  printf '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"%s","namespace":"tenant"},"spec":{%s"containers":[{"name":"c","image":"busybox","resources":{"limits":{"nvidia.com/gpu":"%s"}}}]}}' \
    "$1" "${3:-}" "$2"
}

# scale_flow NAME RUNTIME_CLASS [--privileged]: the steps; what each pod saw stays in the files.
scale_flow() {
  local name=$1 p1 p2 p3 tenant=()
  echo "== $name: gpufence autoscale against the cluster stand-in, runtime class $2 ${3:-}"
  # On the system's line, other teams' pods no node can take sit Pending from the start: 64
  # GPUs, and a nodeSelector no node has. They must not freeze the scale-up.
  if [ "$(gf_line_field "$line" source)" = system ] && [ "$name" = unpriv ]; then
    tenant=(--foreign-pod "$(tenant_pod huge 64)"
      --foreign-pod "$(tenant_pod nowhere 1 '"nodeSelector":{"zone":"nowhere"},')")
  fi
  # A stand-in that does not start is a failure, not a flow quietly left out.
  if ! start_cluster "$@" "${tenant[@]}"; then
    check "$name: the cluster stand-in starts" false
    tail -20 "$work/$name.out" | sed "s/^/  [$name stand-in] /"
    return
  fi
  check "$name: the node advertises the plugin's 2 GPUs" said "$name" "^node gpu-node-1 allocatable 2$"

  # Demand for one pod: one replica, run through the handler.
  set_streams 8
  autoscale "$name" 1-pod
  check "$name: demand for 1 pod scales 0 -> 1" grep -q "replicas 0 -> 1 (scaled)" "$work/$name.autoscale-1-pod"
  wait_for "$name" "^pod [^ ]+ (probed|error)"
  p1=$(pod_n "$name" 1)

  # Demand for two: the second replica.
  set_streams 16
  autoscale "$name" 2-pods
  check "$name: demand for 2 pods scales 1 -> 2" grep -q "replicas 1 -> 2 (scaled)" "$work/$name.autoscale-2-pods"
  wait_for "$name" "^pod [^ ]+-2 (probed|error)"
  p2=$(pod_n "$name" 2)
  if [ ${#tenant[@]} -gt 0 ]; then
    wait_for "$name" "^event Normal PendingPodNotCounted pod tenant/nowhere"
    check "$name: a tenant's 64-GPU Pending pod is named in an Event, not counted" \
      said "$name" "^event Normal PendingPodNotCounted pod tenant/huge: requests 64 nvidia.com/gpu .*allocatable 2 is less"
    check "$name: so is one whose nodeSelector no node has" \
      said "$name" "^event Normal PendingPodNotCounted pod tenant/nowhere: requests 1 nvidia.com/gpu .*lacks label zone=nowhere"
    check "$name: the autoscaler names them on stdout too" grep -q "not demand: pod tenant/huge" "$work/$name.autoscale-2-pods"
  fi

  # Demand for five: no free GPU, so no third replica; the autoscaler says so.
  set_streams 40
  autoscale "$name" 5-pods
  check "$name: demand for 5 pods stays at 2" grep -q "replicas 2 -> 2$" "$work/$name.autoscale-5-pods"
  check "$name: the autoscaler says the free GPUs capped it" grep -q "capped at 2 by 0 free GPU(s)" "$work/$name.autoscale-5-pods"
  wait_for "$name" "^event Warning ScaleUpCappedByGpus "
  check "$name: it posted a Warning ScaleUpCappedByGpus Event" said "$name" "^event Warning ScaleUpCappedByGpus .*capped at 2 by 0 free GPU"
  check "$name: and Normal ScaledUp Events for 0 -> 1 and 1 -> 2" \
    test "$(grep -cE '^event Normal ScaledUp replicas (0 -> 1|1 -> 2):' "$work/$name.out")" = 2
  check "$name: and never scaled past 2 itself" never "$name" "^event Normal ScaledUp replicas 2 -> "

  # A hand-made scale past the GPUs (kubectl scale --replicas=3): the scheduler keeps it Pending.
  kubectl_scale 3
  wait_for "$name" "^pod [^ ]+-3 pending "
  p3=$(pod_n "$name" 3)
  kube pods > "$work/$name.pods"
  sed "s/^/  [$name pods] /" "$work/$name.pods"
  check "$name: the API shows the first replica Running on the node" grep -qx "$p1 Running gpu-node-1 True -" "$work/$name.pods"
  check "$name: the API shows the second replica Running on the node" grep -qx "$p2 Running gpu-node-1 True -" "$work/$name.pods"
  check "$name: the API shows the third Pending, unbound, PodScheduled=False Unschedulable" grep -qx "$p3 Pending - False Unschedulable" "$work/$name.pods"
  check "$name: containerd has no sandbox for the Pending pod" test "$(sandboxes_of "$p3")" = 0
  check "$name: containerd runs both replicas (sandbox + container each)" test "$(sandboxes_of "$p1")$(sandboxes_of "$p2")" = 22
  autoscale "$name" with-pending
  check "$name: with a Pending pod the autoscaler adds nothing (3 -> 3)" grep -q "replicas 3 -> 3$" "$work/$name.autoscale-with-pending"

  # Back to 2: the ReplicaSet deletes the unscheduled pod, not a running one.
  kubectl_scale 2
  wait_for "$name" "^pod [^ ]+ deleted"
  check "$name: scaling back to 2 deletes the Pending pod" said "$name" "^pod $p3 deleted$"
  check "$name: and no running replica" never "$name" "^pod ($p1|$p2) deleted$"
  check "$name: the Pending pod was never bound, admitted nor run" never "$name" "^pod $p3 (bound|ids|running|container|exec)"
  stop_cluster "$name"
  check "$name: the stand-in saw no pod fail" test "$(cat "$work/$name.rc")" = 0
  check "$name: the stand-in shows 2 of 2 GPUs allocated at the end" said "$name" "^node gpu-node-1 allocated 2 of 2$"
  check "$name: it was told Insufficient nvidia.com/gpu" said "$name" "^pod $p3 pending Unschedulable 0/1 nodes are available: 1 Insufficient nvidia.com/gpu\."
  check "$name: the replicas hold different GPUs" test "$(gpu_of "$name" "$p1")$(gpu_of "$name" "$p2")" = 01 -o "$(gpu_of "$name" "$p1")$(gpu_of "$name" "$p2")" = 10
  flow_pods=("$p1" "$p2")
}

# isolated NAME CHANNELS: each replica reaches only its own GPU, and gpufence-runtime granted it
# from one of the kubelet's CHANNELS (docs/trust-model.md).
isolated() {
  local name=$1 channels=$2 p own other
  for p in "${flow_pods[@]}"; do
    own=$(gpu_of "$name" "$p"); other=$((1 - ${own/\?/0}))
    check "$name: $p opens its GPU $own" test "$(result "$name" "$p" /dev/nvidia"$own")" = ENXIO
    check "$name: $p has no node for GPU $other" test "$(result "$name" "$p" /dev/nvidia$other)" = ENOENT
    check "$name: $p cannot open GPU $other even after mknod" test "$(result "$name" "$p" /tmp/n$other)" != ENXIO -a -n "$(result "$name" "$p" /tmp/n$other)"
    check "$name: gpufence-runtime granted $p GPU $own, from the kubelet's channels" \
      grep -Eq "channel=($channels) .*granted=${GPU[${own/\?/0}]} " "$work/$name.decisions"
  done
}

if [ "$mode" = nri ]; then
  # gpufence-nri with the node's runtime.toml: its decisions land in the same log the flows read.
  GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml "$build/bin/gpufence-nri" --socket "$work/nri/nri.sock" \
    --hook-binary "$build/bin/gpufence-runtime" 2> "$work/nri.stderr" &
  nri_pid=$!
  trap 'kill "$nri_pid" 2>/dev/null; cleanup' EXIT
  for _ in $(seq 100); do grep -q 'nri.synchronized' "$work/runtime.log" 2>/dev/null && break; sleep 0.1; done
  check "gpufence-nri registered with containerd" grep -q 'nri.synchronized' "$work/runtime.log"
  # nri_isolated NAME: each replica opens only its own GPU, the other is denied even after mknod
  # (a privileged replica keeps the other node: NRI does not forward a device removal), and
  # gpufence-nri granted it from the kubelet's channels.
  nri_isolated() {
    local name=$1 p own other
    for p in "${flow_pods[@]}"; do
      own=$(gpu_of "$name" "$p"); other=$((1 - ${own/\?/0}))
      check "$name: $p opens its GPU $own" test "$(result "$name" "$p" /dev/nvidia"$own")" = ENXIO
      check "$name: $p cannot open GPU $other" test "$(result "$name" "$p" /dev/nvidia$other)" != ENXIO
      check "$name: $p cannot open GPU $other even after mknod" test "$(result "$name" "$p" /tmp/n$other)" != ENXIO -a -n "$(result "$name" "$p" /tmp/n$other)"
      check "$name: gpufence-nri granted $p GPU $own" grep -Eq "nri.decision .*granted=${GPU[${own/\?/0}]} " "$work/$name.decisions"
    done
  }
  scale_flow nri-unpriv ""
  nri_isolated nri-unpriv
  scale_flow nri-priv "" --privileged
  nri_isolated nri-priv
  kill "$nri_pid" 2>/dev/null && wait "$nri_pid" 2>/dev/null
  scale_flow nri-down "" --privileged
  p1=${flow_pods[0]} p2=${flow_pods[1]}
  check "nri-down: with the plugin stopped the second replica reaches the first one's GPU" \
    test "$(result nri-down "$p2" /tmp/n"$(gpu_of nri-down "$p1")")" = ENXIO
  [ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line (nri)"; tail -30 "$work/containerd.log"; exit 1; }
  echo "containerd $line (nri): all checks passed"
  exit 0
fi

scale_flow unpriv gpufence
isolated unpriv "device-specs|cdi-annotations"

scale_flow priv gpufence --privileged
isolated priv "device-specs|cdi-annotations|mount-markers"

# The same privileged Deployment through the plain runc handler: the new replica reaches the GPU
# the first one holds (and the other way round), so isolation comes from gpufence-runtime.
scale_flow leak runc --privileged
check "leak: gpufence-runtime was not called" test ! -s "$work/leak.decisions"
p1=${flow_pods[0]} p2=${flow_pods[1]}
check "leak: the second replica (plain runc, privileged) reaches the first one's GPU" \
  test "$(result leak "$p2" /tmp/n"$(gpu_of leak "$p1")")" = ENXIO
check "leak: the first replica reaches the second one's GPU" \
  test "$(result leak "$p1" /tmp/n"$(gpu_of leak "$p2")")" = ENXIO

[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line"; tail -30 "$work/containerd.log"; exit 1; }
echo "containerd $line: all checks passed"
