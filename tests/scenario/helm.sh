#!/usr/bin/env bash
# The Helm chart deploy/helm/gpufence: helm lint, helm template per distribution with assertions
# on what renders (host paths, the installer's host access, RBAC exactly as the code calls the
# API, the doctor agent and the monitoring objects), and deploy/kubernetes/*.yaml in sync with the
# chart they are generated from. (The alerts and dashboard with promtool: monitoring.sh.)
# helm comes from $HELM, PATH, or deploy/helm/fetch-helm.sh (npm, at test time, into the build
# tree); without one the test skips saying why.
# Usage: helm.sh CASE
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
chart=$src/deploy/helm/gpufence
helm=$("$src/deploy/helm/fetch-helm.sh" "$build/tools/helm") || { rc=$?; [ $rc = 77 ] && { echo "SKIP: no helm"; exit 77; }; exit $rc; }
python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3-yaml is not installed"; exit 77; }
work=$(gf_work_dir gpufence-helm)
trap 'rm -rf "$work"' EXIT
template() { "$helm" template gf "$chart" --namespace gpufence "$@"; }

# assert.py RENDERED.yaml EXPR...: each EXPR is Python evaluated with `docs` (the rendered
# objects) and `kind(K)`, `one(K, NAME)`, `args(OBJ)`, `mounts(OBJ)`, `hostpaths(OBJ)` in scope.
cat > "$work/assert.py" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
def kind(k): return [d for d in docs if d["kind"] == k]
def one(k, name):
    found = [d for d in kind(k) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{k}/{name}: {len(found)} rendered"
    return found[0]
def pod(o):
    spec = o["spec"]
    if o["kind"] == "CronJob": spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]
def args(o): return pod(o)["containers"][0]["args"]
def mounts(o): return {m["mountPath"]: m for m in pod(o)["containers"][0].get("volumeMounts", [])}
def hostpaths(o): return {v["name"]: v["hostPath"]["path"] for v in pod(o)["volumes"] if "hostPath" in v}
def rules(k, name): return sorted((g, r, v, tuple(x.get("resourceNames", [])))
    for x in one(k, name)["rules"] for g in x["apiGroups"] for r in x["resources"] for v in x["verbs"])
bad = 0
for expr in sys.argv[2:]:
    try:
        ok = eval(expr)
    except Exception as e:
        ok = False; expr += f"  ({type(e).__name__}: {e})"
    if not ok:
        print("  assertion failed:", expr); bad += 1
sys.exit(1 if bad else 0)
PY
assert() { python3 "$work/assert.py" "$@"; }

case ${1:?usage: helm.sh CASE} in  # gf:cases
  lint)
    for d in containerd microk8s k3s rke2 k0s; do
      check "helm lint, distribution=$d" "$helm" lint --strict "$chart" --set distribution=$d --set doctor.nodeName=n1 --set autoscaler.enabled=true
    done
    check "helm lint with the doctor agent and every monitoring object on" "$helm" lint --strict "$chart" \
      --set doctor.agent.enabled=true --set doctor.cronJob.enabled=true --set monitoring.serviceMonitor.enabled=true \
      --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true
    check "helm lint with allocation=dra and monitoring on (no device plugin to scrape)" "$helm" lint --strict "$chart" \
      --set allocation=dra --set doctor.agent.enabled=true --set monitoring.serviceMonitor.enabled=true \
      --set monitoring.prometheusRule.enabled=true
    out=$(template --set distribution=kubeadm 2>&1)
    check "an unknown distribution is refused, naming the choices" grep -q "distribution must be one of containerd, k0s, k3s, microk8s, rke2" <<<"$out"
    ;;
  paths)
    # distribution -> kubelet dir, containerd config, socket (docs/install.md)
    rows=0
    while read -r d kubelet config socket; do
      rows=$((rows + 1))
      installer=true
      [ "$config" = - ] && installer=false
      template --set distribution=$d --set installer.enabled=$installer --set doctor.nodeName=n1 > "$work/$d.yaml" || { check "render $d" false; continue; }
      # The kubelet's device-plugin directory ignores --root-dir (k0s's and microk8s's kubelet
      # dirs have no device-plugins of the kubelet's): the same on every distribution.
      check "$d: device plugin registers in the kubelet's constant directory" assert "$work/$d.yaml" \
        "hostpaths(one('DaemonSet','gpufence-device-plugin'))['device-plugins'] == '/var/lib/kubelet/device-plugins'" \
        "'--plugin-dir=/var/lib/kubelet/device-plugins' in args(one('DaemonSet','gpufence-device-plugin'))"
      [ $installer = true ] && check "$d: installer edits $config and verifies on $socket" assert "$work/$d.yaml" \
        "'--distribution=$d' in args(one('DaemonSet','gpufence-node-installer'))" \
        "'--containerd-config=$config' in args(one('DaemonSet','gpufence-node-installer'))" \
        "'--containerd-socket=$socket' in args(one('DaemonSet','gpufence-node-installer'))"
      check "$d: doctor asks the kubelet at its pod-resources socket" assert "$work/$d.yaml" \
        "'--pod-resources-socket=$kubelet/pod-resources/kubelet.sock' in args(one('Job','gpufence-doctor'))"
      check "$d: so does the device plugin, through the host's pod-resources directory read-only" assert "$work/$d.yaml" \
        "'--pod-resources-socket=$kubelet/pod-resources/kubelet.sock' in args(one('DaemonSet','gpufence-device-plugin'))" \
        "hostpaths(one('DaemonSet','gpufence-device-plugin'))['pod-resources'] == '$kubelet/pod-resources'" \
        "mounts(one('DaemonSet','gpufence-device-plugin'))['$kubelet/pod-resources']['readOnly'] is True"
    done < <(python3 - "$chart/templates/_helpers.tpl" <<'PY'
# The rows of the chart's own gpufence.distributions define (test_distribution_table checks
# them against the C++ table): name, kubelet dir, containerd config and socket ("-" without
# the installer).
import sys, yaml
text = open(sys.argv[1]).read()
begin = text.index('{{- define "gpufence.distributions" -}}')
body = text[text.index("-}}", begin) + 3:text.index("{{- end -}}", begin)]
for name, d in yaml.safe_load(body).items():
    if d.get("installer", True):
        print(name, d["kubeletDir"], d["containerdConfig"], d["containerdSocket"])
    else:
        print(name, d["kubeletDir"], "-", "-")
PY
)
    check "the chart's distributions were read ($rows)" test "$rows" -gt 0
    template --set distribution=microk8s --set paths.kubeletDir=/srv/kubelet --set paths.devicePluginDir=/srv/dp \
      --set driver.root=/run/nvidia/driver --set doctor.nodeName=n1 > "$work/o.yaml"
    check "paths.* and driver.root override the distribution's" assert "$work/o.yaml" \
      "hostpaths(one('DaemonSet','gpufence-device-plugin'))['device-plugins'] == '/srv/dp'" \
      "'--pod-resources-socket=/srv/kubelet/pod-resources/kubelet.sock' in args(one('Job','gpufence-doctor'))" \
      "hostpaths(one('DaemonSet','gpufence-device-plugin'))['driver-libs'] == '/run/nvidia/driver/usr/lib/x86_64-linux-gnu'" \
      "'--nvml-library=/host/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1' in args(one('DaemonSet','gpufence-node-installer'))" \
      "'--driver-root=/run/nvidia/driver' in args(one('DaemonSet','gpufence-node-installer'))"
    template --set image.repository=reg.example/gf --set image.tag=t1 --set 'nodeSelector.gpu=yes' > "$work/i.yaml"
    check "image and nodeSelector reach every node agent" assert "$work/i.yaml" \
      "all(pod(d)['containers'][0]['image'] == 'reg.example/gf:t1' for d in kind('DaemonSet'))" \
      "all(pod(d)['nodeSelector'] == {'nvidia.com/gpu.present': 'true', 'gpu': 'yes'} for d in kind('DaemonSet'))" \
      "one('RuntimeClass','nvidia')['handler'] == 'nvidia'"
    ;;
  installer)
    template --set distribution=microk8s > "$work/r.yaml"
    check "the installer has the host at /host (and a writable /tmp on its read-only root), hostPID, privileged, no API token" assert "$work/r.yaml" \
      "hostpaths(one('DaemonSet','gpufence-node-installer')) == {'host': '/'}" \
      "'/tmp' in mounts(one('DaemonSet','gpufence-node-installer'))" \
      "mounts(one('DaemonSet','gpufence-node-installer'))['/host'].get('readOnly') is not True" \
      "pod(one('DaemonSet','gpufence-node-installer'))['hostPID'] is True" \
      "pod(one('DaemonSet','gpufence-node-installer'))['containers'][0]['securityContext']['privileged'] is True" \
      "pod(one('DaemonSet','gpufence-node-installer'))['automountServiceAccountToken'] is False" \
      "'serviceAccountName' not in pod(one('DaemonSet','gpufence-node-installer'))"
    check "it runs install --watch through nsenter with the host root" assert "$work/r.yaml" \
      "args(one('DaemonSet','gpufence-node-installer'))[0] == '--host-root=/host'" \
      "'install' in args(one('DaemonSet','gpufence-node-installer'))" \
      "'--watch' in args(one('DaemonSet','gpufence-node-installer'))" \
      "'--host-exec=nsenter' in args(one('DaemonSet','gpufence-node-installer'))"
    # installer.enforcement reaches `install --enforcement`; gpufence's own pods tolerate a
    # missing gpufence-nri (required_plugins on containerd >= 2.2).
    check "enforcement defaults to runtime" assert "$work/r.yaml" \
      "'--enforcement=runtime' in args(one('DaemonSet','gpufence-node-installer'))"
    template --set distribution=microk8s --set installer.enforcement=nri > "$work/nri.yaml"
    check "installer.enforcement=nri is passed on" assert "$work/nri.yaml" \
      "'--enforcement=nri' in args(one('DaemonSet','gpufence-node-installer'))"
    check "no pod of the chart carries an NRI waiver, nor does the installer write one" assert "$work/nri.yaml" \
      "not any('tolerate-missing' in k for d in kind('DaemonSet') + kind('Deployment') + kind('Job') for k in d['spec']['template']['metadata'].get('annotations', {}))" \
      "not any(a.startswith('--nri-tolerate-annotation') for a in args(one('DaemonSet','gpufence-node-installer')))"
    check "no GPU CDI kind of another driver is listed by default" assert "$work/r.yaml" \
      "not any(a.startswith('--gpu-cdi-kind') for a in args(one('DaemonSet','gpufence-node-installer')))"
    template --set installer.enforcement=nri --set 'installer.gpuCdiKinds={k8s.gpu.nvidia.com/claim}' > "$work/kinds.yaml"
    check "installer.gpuCdiKinds reaches install as --gpu-cdi-kind" assert "$work/kinds.yaml" \
      "'--gpu-cdi-kind=k8s.gpu.nvidia.com/claim' in args(one('DaemonSet','gpufence-node-installer'))"
    out=$(template --set installer.enforcement=shim 2>&1)
    check "an unknown enforcement is refused, naming the choices" grep -q "installer.enforcement must be one of auto, nri, runtime, both" <<<"$out"
    check "its /healthz is the readiness probe" assert "$work/r.yaml" \
      "pod(one('DaemonSet','gpufence-node-installer'))['containers'][0]['readinessProbe']['httpGet']['path'] == '/healthz'"
    # Every flag the chart passes must be one gpufence install accepts.
    if [ -x "$build/bin/gpufence" ]; then
      help=$("$build/bin/gpufence" install --help)
      for flag in $(python3 -c "
import yaml,sys
d=[x for x in yaml.safe_load_all(open('$work/kinds.yaml')) if x and x['kind']=='DaemonSet' and x['metadata']['name']=='gpufence-node-installer'][0]
a=d['spec']['template']['spec']['containers'][0]['args']
print(' '.join(x.split('=')[0] for x in a[a.index('install')+1:]))"); do
        check "gpufence install knows $flag" grep -q -- "$flag" <<<"$help"
      done
    fi
    check "the device plugin gets no host PID, and an API token only for its Node's Events (devicePlugin.nodeEvents)" assert "$work/r.yaml" \
      "'hostPID' not in pod(one('DaemonSet','gpufence-device-plugin'))" \
      "pod(one('DaemonSet','gpufence-device-plugin'))['serviceAccountName'] == 'gpufence-device-plugin'" \
      "'--in-cluster' in args(one('DaemonSet','gpufence-device-plugin'))" \
      "pod(one('DaemonSet','gpufence-device-plugin'))['containers'][0]['env'] == [{'name': 'NODE_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'spec.nodeName'}}}]"
    template --set devicePlugin.nodeEvents=false > "$work/ne.yaml"
    check "devicePlugin.nodeEvents=false: no API token, no --in-cluster, no service account or Role" assert "$work/ne.yaml" \
      "pod(one('DaemonSet','gpufence-device-plugin'))['automountServiceAccountToken'] is False" \
      "'serviceAccountName' not in pod(one('DaemonSet','gpufence-device-plugin'))" \
      "'--in-cluster' not in args(one('DaemonSet','gpufence-device-plugin'))" \
      "kind('ServiceAccount') == [] and kind('Role') == [] and kind('RoleBinding') == []"
    # Every flag the chart passes must be one gpufence-device-plugin accepts.
    if [ -x "$build/bin/gpufence-device-plugin" ]; then
      help=$("$build/bin/gpufence-device-plugin" --help)
      for flag in $(python3 -c "
import yaml
d=[x for x in yaml.safe_load_all(open('$work/r.yaml')) if x and x['kind']=='DaemonSet' and x['metadata']['name']=='gpufence-device-plugin'][0]
print(' '.join(x.split('=')[0] for x in d['spec']['template']['spec']['containers'][0]['args']))"); do
        check "gpufence-device-plugin knows $flag" grep -q -- "$flag" <<<"$help"
      done
    fi
    ;;
  rbac)
    template --set doctor.nodeName=n1 --set doctor.cronJob.enabled=true --set doctor.agent.enabled=true --set autoscaler.enabled=true \
      --set autoscaler.deployment=video/deepstream --set autoscaler.streamsConfigMap=video/streams:count > "$work/r.yaml"
    # The API calls in the code (src/doctor/gather.cpp read_kube_view, node_report.cpp's Node
    # condition and Events; src/autoscale/controller.cpp reconcile + streams_from_configmap,
    # events.cpp, leader.cpp, and src/kube/watch.cpp's list + watch; the device plugin's Events),
    # each a rule below. If a call is added there, the count check fails until this table and the
    # chart's RBAC follow (tests/unit/test_autoscale.cpp RbacIsExactlyWhatTheCallsNeed checks the
    # same against the requests the controller really sends).
    doctor_reads="('', 'nodes', 'get', ()), ('', 'pods', 'list', ()), ('node.k8s.io', 'runtimeclasses', 'list', ()), ('resource.k8s.io', 'resourceslices', 'list', ())"
    check "doctor with the agent (--report-node): its reads, nodes/status patch, events create — nothing more" assert "$work/r.yaml" \
      "rules('ClusterRole','gpufence-doctor') == sorted([$doctor_reads, ('', 'nodes/status', 'patch', ()), ('events.k8s.io', 'events', 'create', ())])"
    template --set doctor.nodeName=n1 --set doctor.cronJob.enabled=true > "$work/j.yaml"
    check "doctor as Job and CronJob only (no --report-node): nodes get, pods list, runtimeclasses list, resourceslices list" assert "$work/j.yaml" \
      "rules('ClusterRole','gpufence-doctor') == sorted([$doctor_reads])" \
      "not any('--report-node' in args(d) for d in kind('Job') + kind('CronJob'))"
    template --set doctor.agent.enabled=true --set doctor.agent.reportNode=false > "$work/nr.yaml"
    check "doctor.agent.reportNode=false: the agent writes nothing, so neither does its role" assert "$work/nr.yaml" \
      "rules('ClusterRole','gpufence-doctor') == sorted([$doctor_reads])" \
      "'--report-node' not in args(one('DaemonSet','gpufence-doctor-agent'))"
    check "device plugin: Events (create) in namespace default, where its Node's go — nothing more" assert "$work/r.yaml" \
      "one('Role','gpufence-device-plugin')['metadata']['namespace'] == 'default'" \
      "rules('Role','gpufence-device-plugin') == [('events.k8s.io', 'events', 'create', ())]" \
      "'gpufence-device-plugin' not in [r['metadata']['name'] for r in kind('ClusterRole')]"
    check "autoscaler: nodes and pods list + watch cluster-wide, never get — nothing more" assert "$work/r.yaml" \
      "rules('ClusterRole','gpufence-autoscale') == sorted([('', 'nodes', 'list', ()), ('', 'nodes', 'watch', ()), ('', 'pods', 'list', ()), ('', 'pods', 'watch', ())])"
    check "autoscaler: the one Deployment (get), its scale (get, update), Events (create), in its namespace" assert "$work/r.yaml" \
      "one('Role','gpufence-autoscale-deployment')['metadata']['namespace'] == 'video'" \
      "rules('Role','gpufence-autoscale-deployment') == sorted([('apps', 'deployments', 'get', ('deepstream',)), ('apps', 'deployments/scale', 'get', ('deepstream',)), ('apps', 'deployments/scale', 'update', ('deepstream',)), ('events.k8s.io', 'events', 'create', ())])"
    check "autoscaler: get the one ConfigMap" assert "$work/r.yaml" \
      "one('Role','gpufence-autoscale-streams')['metadata']['namespace'] == 'video'" \
      "rules('Role','gpufence-autoscale-streams') == [('', 'configmaps', 'get', ('streams',))]"
    check "autoscaler: the Lease the CLI defaults to (get, update by name; create unnamed)" assert "$work/r.yaml" \
      "one('Role','gpufence-autoscale-lease')['metadata']['namespace'] == 'video'" \
      "rules('Role','gpufence-autoscale-lease') == sorted([('coordination.k8s.io', 'leases', 'get', ('gpufence-autoscale-deepstream',)), ('coordination.k8s.io', 'leases', 'update', ('gpufence-autoscale-deepstream',)), ('coordination.k8s.io', 'leases', 'create', ())])" \
      "'--lease=video/gpufence-autoscale-deepstream' in args(one('Deployment','gpufence-autoscale'))"
    check "autoscaler: replicas elect a leader, each named by POD_NAME (downward API); no --gpus-per-pod" assert "$work/r.yaml" \
      "one('Deployment','gpufence-autoscale')['spec']['replicas'] == 2" \
      "pod(one('Deployment','gpufence-autoscale'))['containers'][0]['env'] == [{'name': 'POD_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'metadata.name'}}}]" \
      "not any(a.startswith('--gpus-per-pod') for a in args(one('Deployment','gpufence-autoscale')))"
    check "each binding names its own service account" assert "$work/r.yaml" \
      "all(b['subjects'] == [{'kind': 'ServiceAccount', 'name': 'gpufence-autoscale' if b['roleRef']['name'].startswith('gpufence-autoscale') else b['roleRef']['name'], 'namespace': 'gpufence'}] and b['roleRef']['name'] == b['metadata']['name'] for b in kind('ClusterRoleBinding') + kind('RoleBinding'))" \
      "all(b['metadata'].get('namespace') == one('Role', b['roleRef']['name'])['metadata']['namespace'] for b in kind('RoleBinding'))"
    check "no other roles at all" assert "$work/r.yaml" \
      "sorted(r['metadata']['name'] for r in kind('ClusterRole') + kind('Role')) == ['gpufence-autoscale', 'gpufence-autoscale-deployment', 'gpufence-autoscale-lease', 'gpufence-autoscale-streams', 'gpufence-device-plugin', 'gpufence-doctor']"
    # Deployment, ConfigMap and Lease in three namespaces: each Role goes where its object is.
    template --set autoscaler.enabled=true --set autoscaler.deployment=video/ds \
      --set autoscaler.streamsConfigMap=media/load:n --set autoscaler.lease=ops/ds-leader > "$work/n.yaml"
    check "autoscaler: each Role in the namespace of the object it names" assert "$work/n.yaml" \
      "one('Role','gpufence-autoscale-deployment')['metadata']['namespace'] == 'video'" \
      "one('Role','gpufence-autoscale-streams')['metadata']['namespace'] == 'media'" \
      "one('Role','gpufence-autoscale-lease')['metadata']['namespace'] == 'ops'" \
      "('coordination.k8s.io', 'leases', 'get', ('ds-leader',)) in rules('Role','gpufence-autoscale-lease')" \
      "('', 'configmaps', 'get', ('load',)) in rules('Role','gpufence-autoscale-streams')" \
      "'--lease=ops/ds-leader' in args(one('Deployment','gpufence-autoscale'))"
    out=$(template --set autoscaler.enabled=true --set autoscaler.lease=nolease 2>&1)
    check "autoscaler: a lease that is not NAMESPACE/NAME is refused" grep -q "autoscaler.lease must be NAMESPACE/NAME" <<<"$out"
    # Every flag the chart passes must be one gpufence autoscale accepts.
    if [ -x "$build/bin/gpufence" ]; then
      help=$("$build/bin/gpufence" autoscale --help)
      for flag in $(python3 -c "
import yaml
d=[x for x in yaml.safe_load_all(open('$work/r.yaml')) if x and x['kind']=='Deployment'][0]
a=d['spec']['template']['spec']['containers'][0]['args']
print(' '.join(x.split('=')[0] for x in a[a.index('autoscale')+1:]))"); do
        check "gpufence autoscale knows $flag" grep -q -- "$flag" <<<"$help"
      done
    fi
    # Every request through the KubeClient seam (request/get/call/stream), whatever the receiver
    # is called; shown when the count is off.
    calls() { grep -HnE '(\.|->)(get|request|call|stream)\(([^)]|$)' "$@" | grep -vE '^[^:]+:[0-9]+:\s*//'; }
    # count N WHAT FILES...: exactly N such calls, else they are listed.
    count() {
      local want=$1 what=$2 n
      shift 2
      n=$(calls "$@" | wc -l)
      check "$what makes the $want API calls the table covers (found $n)" test "$n" = "$want"
      [ "$n" = "$want" ] || calls "$@" | sed 's/^/    /'
    }
    # Node get, pods list, RuntimeClasses list, slices list (gather.cpp); with --report-node the
    # Node get and its status patch (node_report.cpp).
    count 6 "the doctor" "$src"/src/doctor/*.cpp "$src"/src/cli/cmd_doctor.cpp
    # gpufence-dra (the dra case checks its ClusterRole): node get, claim get, slice get/post/put.
    count 5 "gpufence-dra" "$src"/src/dra/*.cpp
    # nodes and pods list + watch (the same two lines of watch.cpp), Deployment get, scale get and
    # put, ConfigMap get, Lease get/post/put, and the release's get and put; Events below.
    count 11 "the autoscaler" "$src"/src/autoscale/*.cpp "$src"/src/kube/watch.cpp
    count 0 "the device plugin (Events below)" "$src"/src/deviceplugin/*.cpp "$src"/src/cli/device_plugin_main.cpp
    # Events: every component posts them through post_event (src/kube/events.cpp: a POST, again
    # with a later name after a 409), directly or through its EventQueue, whose path is the API
    # group the roles grant.
    count 2 "the Event helper (src/kube/events.cpp)" "$src"/src/kube/events.cpp
    check "the Event helper posts events.k8s.io/v1 Events, the group the roles grant" \
      grep -q '"/apis/events.k8s.io/v1/namespaces/"' "$src/src/kube/events.cpp"
    posts_events() { grep -qE '(^|[^_[:alnum:]])(post_[a-z_]*event\(|EventQueue\b)' "$@"; }
    check "the doctor posts Events (its role: events create with the agent's --report-node)" posts_events "$src"/src/doctor/*.cpp
    check "the device plugin posts Events (its Role: events create)" posts_events "$src"/src/deviceplugin/*.cpp "$src"/src/cli/device_plugin_main.cpp
    check "the autoscaler posts Events (its Role: events create)" posts_events "$src"/src/autoscale/*.cpp
    check "gpufence-dra posts none (its ClusterRole has no events)" bash -c "! grep -qE '(^|[^_[:alnum:]])(post_[a-z_]*event\(|EventQueue\b)' '$src'/src/dra/*.cpp '$src'/src/cli/dra_main.cpp"
    template > "$work/d.yaml"
    check "by default: no doctor, no autoscaler, so only the device plugin's Role" assert "$work/d.yaml" \
      "kind('ClusterRole') == [] and [r['metadata']['name'] for r in kind('Role')] == ['gpufence-device-plugin']" \
      "kind('Job') == [] and kind('Deployment') == []"
    ;;
  nri-waiver)
    # The NRI waiver (containerd's tolerate_missing_plugins_annotation) is read from the pod in
    # three forms (nri@v0.12.0 pkg/plugin GetEffectiveAnnotation: KEY/container.NAME, KEY/pod,
    # KEY); the chart's ValidatingAdmissionPolicy rejects every pod carrying any of them, in every
    # namespace, and the chart itself carries and writes none (docs/install.md, "Helm").
    template --set installer.enforcement=nri --set doctor.nodeName=n1 > "$work/w.yaml"
    check "a ValidatingAdmissionPolicy over pod CREATE and UPDATE, failing closed" assert "$work/w.yaml" \
      "one('ValidatingAdmissionPolicy','gpufence-no-nri-waiver')['apiVersion'] == 'admissionregistration.k8s.io/v1'" \
      "one('ValidatingAdmissionPolicy','gpufence-no-nri-waiver')['spec']['failurePolicy'] == 'Fail'" \
      "one('ValidatingAdmissionPolicy','gpufence-no-nri-waiver')['spec']['matchConstraints']['resourceRules'] == [{'apiGroups': [''], 'apiVersions': ['v1'], 'operations': ['CREATE', 'UPDATE'], 'resources': ['pods']}]"
    check "bound everywhere, denying" assert "$work/w.yaml" \
      "one('ValidatingAdmissionPolicyBinding','gpufence-no-nri-waiver')['spec'] == {'policyName': 'gpufence-no-nri-waiver', 'validationActions': ['Deny']}"
    # The CEL, as the API server gets it: the key, and each of the three forms of it.
    cel="{v['name']: v['expression'] for v in one('ValidatingAdmissionPolicy','gpufence-no-nri-waiver')['spec']['variables']}"
    check "its CEL names the key and all three forms NRI reads" assert "$work/w.yaml" \
      "($cel)['key'] == \"'gpufence.io/tolerate-missing-nri'\"" \
      "'k == variables.key ||' in ($cel)['waivers']" \
      "\"k == variables.key + '/pod'\" in ($cel)['waivers']" \
      "\"k.startsWith(variables.key + '/container.')\" in ($cel)['waivers']" \
      "one('ValidatingAdmissionPolicy','gpufence-no-nri-waiver')['spec']['validations'][0]['expression'] == 'size(variables.waivers) == 0'"
    check "no pod of the chart carries the waiver, in any form" assert "$work/w.yaml" \
      "not any(k.startswith('gpufence.io/tolerate-missing-nri') for d in kind('DaemonSet') + kind('Job') for k in d['spec']['template']['metadata'].get('annotations', {}))"
    template --set nriWaiverPolicy.annotation=example.com/waive > "$work/k.yaml"
    check "nriWaiverPolicy.annotation names another key" assert "$work/k.yaml" \
      "($cel)['key'] == \"'example.com/waive'\""
    template --set nriWaiverPolicy.enabled=false > "$work/off.yaml"
    check "nriWaiverPolicy.enabled=false renders neither" assert "$work/off.yaml" \
      "kind('ValidatingAdmissionPolicy') == [] and kind('ValidatingAdmissionPolicyBinding') == []"
    out=$(template --set "nriWaiverPolicy.annotation=a'b" 2>&1)
    check "a key that is no annotation key is refused (it goes into CEL)" grep -q "nriWaiverPolicy.annotation must be an annotation key" <<<"$out"
    out=$(template --kube-version 1.29.0 2>&1)
    check "before Kubernetes 1.30 (no admissionregistration.k8s.io/v1 policies) it says to switch it off" grep -q "set nriWaiverPolicy.enabled=false" <<<"$out"
    check "which renders there" bash -c "'$helm' template gf '$chart' --namespace gpufence --kube-version 1.29.0 --set nriWaiverPolicy.enabled=false >/dev/null"
    ;;
  dra)
    # allocation=dra: gpufence-dra and its DeviceClass instead of the device plugin (never both
    # for nvidia.com/gpu on a node), RBAC exactly as src/dra/driver.cpp calls the API.
    template --set allocation=dra --set doctor.nodeName=n1 > "$work/d.yaml"
    check "gpufence-dra runs, the device plugin does not" assert "$work/d.yaml" \
      "one('DaemonSet','gpufence-dra')" \
      "[d for d in kind('DaemonSet') if d['metadata']['name'] == 'gpufence-device-plugin'] == []"
    check "the DeviceClass keeps nvidia.com/gpu pod specs working" assert "$work/d.yaml" \
      "one('DeviceClass','gpu.gpufence.io')['apiVersion'] == 'resource.k8s.io/v1'" \
      "one('DeviceClass','gpu.gpufence.io')['spec']['extendedResourceName'] == 'nvidia.com/gpu'" \
      "one('DeviceClass','gpu.gpufence.io')['spec']['selectors'] == [{'cel': {'expression': 'device.driver == \"gpufence.io\"'}}]"
    check "its socket's path is the same in the pod and on the host (the kubelet dials it)" assert "$work/d.yaml" \
      "hostpaths(one('DaemonSet','gpufence-dra'))['plugins-registry'] == '/var/lib/kubelet/plugins_registry'" \
      "'/var/lib/kubelet/plugins_registry' in mounts(one('DaemonSet','gpufence-dra'))" \
      "'--registry-dir=/var/lib/kubelet/plugins_registry' in args(one('DaemonSet','gpufence-dra'))" \
      "pod(one('DaemonSet','gpufence-dra'))['containers'][0]['env'][0]['valueFrom']['fieldRef']['fieldPath'] == 'spec.nodeName'"
    check "RBAC: exactly the calls gpufence-dra makes" assert "$work/d.yaml" \
      "rules('ClusterRole','gpufence-dra') == sorted([('', 'nodes', 'get', ()), ('resource.k8s.io', 'resourceslices', 'get', ()), ('resource.k8s.io', 'resourceslices', 'create', ()), ('resource.k8s.io', 'resourceslices', 'update', ()), ('resource.k8s.io', 'resourceclaims', 'get', ())])"
    check "an admission policy keeps gpufence-dra's writes to its own node's slice" assert "$work/d.yaml" \
      "one('ValidatingAdmissionPolicy','gpufence-dra-own-node-slices')['spec']['failurePolicy'] == 'Fail'" \
      "one('ValidatingAdmissionPolicy','gpufence-dra-own-node-slices')['spec']['matchConditions'][0]['expression'] == \"request.userInfo.username == 'system:serviceaccount:gpufence:gpufence-dra'\"" \
      "'object.spec.nodeName == variables.node' in one('ValidatingAdmissionPolicy','gpufence-dra-own-node-slices')['spec']['validations'][0]['expression']" \
      "one('ValidatingAdmissionPolicyBinding','gpufence-dra-own-node-slices')['spec'] == {'policyName': 'gpufence-dra-own-node-slices', 'validationActions': ['Deny']}"
    template --set allocation=dra --set dra.extendedResourceName= > "$work/e.yaml"
    check "extendedResourceName empty: claims only" assert "$work/e.yaml" \
      "'extendedResourceName' not in one('DeviceClass','gpu.gpufence.io')['spec']"
    template > "$work/dp.yaml"
    check "the default is the device plugin, with no DRA object" assert "$work/dp.yaml" \
      "one('DaemonSet','gpufence-device-plugin')" "kind('DeviceClass') == []" \
      "[d for d in kind('DaemonSet') if d['metadata']['name'] == 'gpufence-dra'] == []"
    check "device-plugin: its DaemonSet is not pinned by the allocation label" assert "$work/dp.yaml" \
      "'affinity' not in pod(one('DaemonSet','gpufence-device-plugin'))"
    check "dra: neither is gpufence-dra's" assert "$work/d.yaml" "'affinity' not in pod(one('DaemonSet','gpufence-dra'))"
    # allocation=per-node: node pool by node pool, the node's label chooses; the two DaemonSets'
    # node affinities exclude each other, so no node runs both for nvidia.com/gpu.
    template --set allocation=per-node --set allocationLabel=example.com/gpu-backend > "$work/pn.yaml"
    term="['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']"
    check "per-node: both backends, each on the nodes the label gives it, and the DeviceClass" assert "$work/pn.yaml" \
      "pod(one('DaemonSet','gpufence-dra'))$term == [{'matchExpressions': [{'key': 'example.com/gpu-backend', 'operator': 'In', 'values': ['dra']}]}]" \
      "pod(one('DaemonSet','gpufence-device-plugin'))$term == [{'matchExpressions': [{'key': 'example.com/gpu-backend', 'operator': 'NotIn', 'values': ['dra']}]}]" \
      "one('DeviceClass','gpu.gpufence.io')['spec']['extendedResourceName'] == 'nvidia.com/gpu'" \
      "pod(one('DaemonSet','gpufence-dra'))['nodeSelector'] == pod(one('DaemonSet','gpufence-device-plugin'))['nodeSelector']"
    out=$(template --set allocation=both 2>&1)
    check "another allocation is refused, naming the choices" grep -q "allocation must be device-plugin, dra or per-node" <<<"$out"
    ;;
  doctor-agent)
    # doctor.agent: the doctor's pod as a DaemonSet on the GPU nodes, serving /metrics and /healthz.
    template --set doctor.agent.enabled=true --set doctor.agent.interval=120 --set doctor.agent.port=9503 \
      --set doctor.agent.resources.limits.memory=256Mi > "$work/a.yaml"
    a="one('DaemonSet','gpufence-doctor-agent')"
    check "a DaemonSet on the chart's GPU nodes, with its tolerations and priority class" assert "$work/a.yaml" \
      "pod($a)['nodeSelector'] == {'nvidia.com/gpu.present': 'true'}" \
      "pod($a)['tolerations'] == pod(one('DaemonSet','gpufence-device-plugin'))['tolerations']" \
      "pod($a)['priorityClassName'] == 'gpufence-node-critical'" \
      "pod($a)['restartPolicy'] == 'Always'"
    check "the doctor Job's pod: host PID, privileged, the host read-only at /host, the cgroup tree, NODE_NAME" assert "$work/a.yaml" \
      "pod($a)['hostPID'] is True and pod($a)['serviceAccountName'] == 'gpufence-doctor'" \
      "pod($a)['containers'][0]['securityContext']['privileged'] is True" \
      "hostpaths($a) == {'host': '/', 'cgroup': '/sys/fs/cgroup'}" \
      "mounts($a)['/host']['readOnly'] is True and '/tmp' in mounts($a) and '/host/sys/fs/cgroup' in mounts($a)" \
      "pod($a)['containers'][0]['env'] == [{'name': 'NODE_NAME', 'valueFrom': {'fieldRef': {'fieldPath': 'spec.nodeName'}}}]"
    check "it runs the doctor every interval, serving on its port, probed on /healthz there, with its own resources" assert "$work/a.yaml" \
      "args($a)[:3] == ['--host-root=/host', '--nvml-library=/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1', 'doctor']" \
      "all(f in args($a) for f in ['--in-cluster', '--probe', '--serve=0.0.0.0:9503', '--interval=120', '--report-node', '--handler=nvidia', '--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock'])" \
      "'--health-address=0.0.0.0:9404' in args($a)" \
      "pod($a)['containers'][0]['ports'] == [{'name': 'metrics', 'containerPort': 9503}, {'name': 'health', 'containerPort': 9404}]" \
      "pod($a)['containers'][0]['livenessProbe']['httpGet'] == {'path': '/healthz', 'port': 'health'}" \
      "pod($a)['containers'][0]['resources']['limits'] == {'memory': '256Mi'}"
    # The doctor takes pods of gpufence's own DaemonSets for gpufence's (src/doctor/gather.hpp
    # GatherOptions::system_daemonsets, --system-daemonset): with the agent that list must name it,
    # and every other DaemonSet the chart can render.
    template --set doctor.agent.enabled=true --set doctor.nodeName=n1 --set doctor.cronJob.enabled=true > "$work/all.yaml"
    template --set doctor.agent.enabled=true --set allocation=dra > "$work/dra.yaml"
    names=$(python3 -c "
import sys, yaml
print(' '.join(sorted({d['metadata']['name'] for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d and d['kind'] == 'DaemonSet'})))" "$work/all.yaml" "$work/dra.yaml")
    for o in "one('DaemonSet','gpufence-doctor-agent')" "one('Job','gpufence-doctor')" "one('CronJob','gpufence-doctor')"; do
      check "${o#one}: --system-daemonset names each DaemonSet of the chart ($names)" assert "$work/all.yaml" \
        "sorted(a.split('=', 1)[1] for a in args($o) if a.startswith('--system-daemonset=')) == '$names'.split()"
    done
    check "the Job and CronJob are as before: restartPolicy Never, no --serve" assert "$work/all.yaml" \
      "pod(one('Job','gpufence-doctor'))['restartPolicy'] == 'Never' and pod(one('CronJob','gpufence-doctor'))['restartPolicy'] == 'Never'" \
      "not any(a.startswith('--serve') for a in args(one('Job','gpufence-doctor')) + args(one('CronJob','gpufence-doctor')))" \
      "'livenessProbe' not in pod(one('Job','gpufence-doctor'))['containers'][0]"
    template > "$work/off.yaml"
    check "off by default" assert "$work/off.yaml" \
      "'gpufence-doctor-agent' not in [d['metadata']['name'] for d in kind('DaemonSet')]"
    # Every flag the agent is given must be one gpufence doctor accepts.
    if [ -x "$build/bin/gpufence" ]; then
      help=$("$build/bin/gpufence" doctor --help)
      for flag in $(python3 -c "
import yaml
d=[x for x in yaml.safe_load_all(open('$work/a.yaml')) if x and x['kind']=='DaemonSet' and x['metadata']['name']=='gpufence-doctor-agent'][0]
a=d['spec']['template']['spec']['containers'][0]['args']
print(' '.join(sorted({x.split('=')[0] for x in a[a.index('doctor')+1:]})))"); do
        check "gpufence doctor knows $flag" grep -q -- "$flag" <<<"$help"
      done
    fi
    ;;
  monitoring)
    # monitoring.*: Prometheus Operator objects and the Grafana dashboard, each only when asked.
    on=(--set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true)
    template > "$work/off.yaml"
    check "off by default: no Service, ServiceMonitor, PrometheusRule or dashboard" assert "$work/off.yaml" \
      "kind('Service') == [] and kind('ServiceMonitor') == [] and kind('PrometheusRule') == [] and kind('ConfigMap') == []"
    template "${on[@]}" --set doctor.agent.enabled=true --set monitoring.serviceMonitor.interval=15s \
      --set monitoring.serviceMonitor.labels.release=prom --set monitoring.prometheusRule.labels.release=prom > "$work/on.yaml"
    check "a headless Service per scraped DaemonSet, selecting its pods, on the port its container serves /metrics on" assert "$work/on.yaml" \
      "sorted(s['metadata']['name'] for s in kind('Service')) == ['gpufence-device-plugin', 'gpufence-doctor-agent']" \
      "all(s['spec']['clusterIP'] == 'None' for s in kind('Service'))" \
      "all(s['spec']['selector'] == one('DaemonSet', s['metadata']['name'])['spec']['selector']['matchLabels'] for s in kind('Service'))" \
      "all(s['spec']['ports'] == [{'name': 'metrics', 'port': [p['containerPort'] for p in pod(one('DaemonSet', s['metadata']['name']))['containers'][0]['ports'] if p['name'] == 'metrics'][0], 'targetPort': 'metrics'}] for s in kind('Service'))" \
      "'--metrics-address=0.0.0.0:9400' in args(one('DaemonSet','gpufence-device-plugin'))" \
      "'--serve=0.0.0.0:9403' in args(one('DaemonSet','gpufence-doctor-agent'))"
    sm="one('ServiceMonitor','gpufence')"
    check "the ServiceMonitor selects exactly those Services, in the release's namespace, every interval" assert "$work/on.yaml" \
      "$sm['apiVersion'] == 'monitoring.coreos.com/v1' and $sm['metadata']['labels']['release'] == 'prom'" \
      "$sm['spec']['namespaceSelector'] == {'matchNames': ['gpufence']}" \
      "[s['metadata']['name'] for s in kind('Service') if all(s['metadata']['labels'].get(k) == v for k, v in $sm['spec']['selector']['matchLabels'].items())] == [s['metadata']['name'] for s in kind('Service')]" \
      "[(e['port'], e['path'], e['interval']) for e in $sm['spec']['endpoints']] == [('metrics', '/metrics', '15s')]"
    check "each series gets node; the target's namespace, pod and container (the metrics' own labels) are dropped" assert "$work/on.yaml" \
      "$sm['spec']['endpoints'][0]['relabelings'] == [{'sourceLabels': ['__meta_kubernetes_pod_node_name'], 'targetLabel': 'node'}, {'action': 'labeldrop', 'regex': 'namespace|pod|container'}]"
    check "the PrometheusRule carries files/alerts.yaml's groups" assert "$work/on.yaml" \
      "one('PrometheusRule','gpufence')['apiVersion'] == 'monitoring.coreos.com/v1'" \
      "one('PrometheusRule','gpufence')['metadata']['labels']['release'] == 'prom'" \
      "one('PrometheusRule','gpufence')['spec'] == yaml.safe_load(open('$chart/files/alerts.yaml'))"
    check "the dashboard ConfigMap, labelled grafana_dashboard" assert "$work/on.yaml" \
      "one('ConfigMap','gpufence-dashboard')['metadata']['labels']['grafana_dashboard'] == '1'" \
      "list(one('ConfigMap','gpufence-dashboard')['data']) == ['gpufence.json']"
    template "${on[@]}" > "$work/noagent.yaml"
    check "without the agent only the device plugin is scraped" assert "$work/noagent.yaml" \
      "[s['metadata']['name'] for s in kind('Service')] == ['gpufence-device-plugin']"
    template "${on[@]}" --set allocation=dra --set doctor.agent.enabled=true --set monitoring.dashboard.namespace=grafana > "$work/dra.yaml"
    check "allocation=dra: no device plugin, so only the agent is scraped; the dashboard goes where Grafana looks" assert "$work/dra.yaml" \
      "[s['metadata']['name'] for s in kind('Service')] == ['gpufence-doctor-agent']" \
      "one('ConfigMap','gpufence-dashboard')['metadata']['namespace'] == 'grafana'"
    ;;
  manifests-in-sync)
    HELM=$helm "$src/deploy/helm/render-manifests.sh" "$work/k8s" 2>/dev/null
    for f in "$src"/deploy/kubernetes/*.yaml "$work"/k8s/*.yaml; do
      n=$(basename "$f")
      check "deploy/kubernetes/$n matches the chart (deploy/helm/render-manifests.sh)" diff -u "$src/deploy/kubernetes/$n" "$work/k8s/$n"
    done
    ;;
  readme)
    # README "On a real cluster": every command in it, checked against what the chart renders
    # (no cluster here: helm install/upgrade become helm template with the same --set values).
    python3 - "$src/README.md" > "$work/readme.json" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
sec = text.split("\n## On a real cluster\n", 1)[1].split("\n## ", 1)[0]
sh = re.search(r"```sh\n(.*?)```", sec, re.S).group(1)
pod = re.search(r"```yaml\n(.*?)```", sec, re.S).group(1)
cmds = [l for l in sh.splitlines() if l and not l.startswith("#")]
print(json.dumps({"cmds": cmds, "pod": pod}))
PY
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pod'])" "$work/readme.json" > "$work/pod.yaml"
    readme_cmds() { python3 -c "import json,sys; print('\n'.join(json.load(open(sys.argv[1]))['cmds']))" "$work/readme.json"; }
    # Pass 1: the helm commands, rendered as helm template (install.yaml, upgrade.yaml).
    while IFS= read -r cmd; do
      set -- $cmd
      [ "$1" = microk8s ] && shift
      [ "$1" = helm ] || continue
      verb=$2
      shift 2
      args=()
      for a in "$@"; do case $a in --create-namespace|--reuse-values) ;; *) args+=("$a") ;; esac; done
      [ "$verb" = upgrade ] && args+=(--set distribution=microk8s)  # what --reuse-values keeps
      (cd "$src" && "$helm" template "${args[@]}") > "$work/$verb.yaml" 2> "$work/$verb.err"
      check "README: '$cmd' renders" test $? = 0
    done < <(readme_cmds)
    # Pass 2: every other command, against what those render.
    while IFS= read -r cmd; do
      set -- $cmd
      [ "$1" = microk8s ] && shift
      case "$1 $2" in
        "helm install"|"helm upgrade") ;;
        "python3 scripts/image/assemble.py")
          check "README: the image command builds the archive" bash -c "python3 '$src/scripts/image/assemble.py' oci '$build' '$work/img.tar' --work '$work/img' --ref '$7' >/dev/null" ;;
        "ctr --namespace")
          check "README: the image goes to the k8s.io namespace, the kubelet's" test "$3 $4 $5" = "k8s.io images import" ;;
        "kubectl label")
          check "README: the node label is the chart's nodeSelector" assert "$work/install.yaml" \
            "all(pod(d)['nodeSelector'] == {'${5%%=*}': '${5#*=}'} for d in kind('DaemonSet'))" ;;
        "kubectl -n")
          case "$4 $5" in
            "rollout status")
              check "README: $6 is rendered in namespace $3" assert "$work/install.yaml" \
                "one('DaemonSet','${6#daemonset/}')['metadata']['namespace'] == '$3'" \
                "'readinessProbe' in pod(one('DaemonSet','${6#daemonset/}'))['containers'][0]" ;;
            "logs -f")
              check "README: $6 is rendered by the upgrade, on gpu-node" assert "$work/upgrade.yaml" \
                "one('Job','${6#job/}')['metadata']['namespace'] == '$3'" "pod(one('Job','${6#job/}'))['nodeName'] == 'gpu-node'" ;;
            *) check "README: a command this test knows: $cmd" false ;;
          esac ;;
        "kubectl apply")
          check "README: the seed's pod names the chart's RuntimeClass, asks one GPU, is privileged" assert "$work/install.yaml" \
            "(lambda p: p['spec']['runtimeClassName'] == kind('RuntimeClass')[0]['metadata']['name'] == kind('RuntimeClass')[0]['handler'] and p['spec']['containers'][0]['resources']['limits'] == {'nvidia.com/gpu': 1} and p['spec']['containers'][0]['securityContext']['privileged'] and p['spec']['nodeSelector'] == kind('RuntimeClass')[0]['scheduling']['nodeSelector'])(yaml.safe_load(open('$work/pod.yaml')))" ;;
        *) check "README: a command this test knows: $cmd" false ;;
      esac
    done < <(readme_cmds)
    check "README: the installer it shows is told distribution=microk8s" assert "$work/install.yaml" \
      "'--distribution=microk8s' in args(one('DaemonSet','gpufence-node-installer'))"
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" = 0 ]
