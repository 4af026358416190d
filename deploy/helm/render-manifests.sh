#!/usr/bin/env bash
# render-manifests.sh [OUT_DIR]: writes deploy/kubernetes/*.yaml from the chart, the one source.
# Run it after editing deploy/helm/gpufence; tests/scenario/helm.sh fails when they differ.
# HELM=path/to/helm, else fetch-helm.sh finds or fetches one (into build/tools/helm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/deploy/kubernetes}
helm=$("$here/fetch-helm.sh" "${HELM_DIR:-$repo/build/tools/helm}")
chart=$repo/deploy/helm/gpufence
mkdir -p "$out"

# render FILE NAMESPACE USAGE TEMPLATE [--set ...]: one plain manifest from chosen templates.
render() {
  local file=$1 ns=$2 usage=$3 templates=$4
  shift 4
  local show=()
  for t in $templates; do show+=(--show-only "templates/$t"); done
  {
    echo "# Generated from deploy/helm/gpufence by deploy/helm/render-manifests.sh: edit the chart, not this."
    echo "# $usage"
    "$helm" template gpufence "$chart" --namespace "$ns" "${show[@]}" "$@" \
      | grep -v '^# Source: '
  } > "$out/$file"
}

render runtimeclass.yaml kube-system "kubectl apply -f deploy/kubernetes/runtimeclass.yaml" \
  runtimeclass.yaml
render device-plugin.yaml kube-system \
  "kubectl apply -f deploy/kubernetes/device-plugin.yaml   (microk8s, k3s: use the chart's distribution value)" \
  "priorityclass.yaml device-plugin.yaml"
render node-installer.yaml kube-system \
  "kubectl apply -f deploy/kubernetes/node-installer.yaml  (plain containerd; the chart for other distributions)" \
  "priorityclass.yaml node-installer.yaml"
render nri-waiver-policy.yaml kube-system \
  "kubectl apply -f deploy/kubernetes/nri-waiver-policy.yaml   (Kubernetes >= 1.30: no pod may carry the NRI waiver annotation)" \
  nri-waiver-policy.yaml
render doctor-job.yaml kube-system \
  "sed s/REPLACE-WITH-NODE-NAME/NODE/ deploy/kubernetes/doctor-job.yaml | kubectl apply -f - && kubectl -n kube-system logs -f job/gpufence-doctor" \
  doctor.yaml --set doctor.nodeName=REPLACE-WITH-NODE-NAME
render autoscaler.yaml video \
  "kubectl apply -f deploy/kubernetes/autoscaler.yaml  (scales video/deepstream by ConfigMap video/streams key count)" \
  autoscaler.yaml --set autoscaler.enabled=true
echo "rendered $(ls "$out"/*.yaml | wc -l) manifests into $out" >&2
