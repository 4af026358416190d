# shellcheck shell=bash disable=SC2154  # src, build, line come from the script sourcing this
# A real single-node Kubernetes for the cluster tier (tests/cluster/, docs/testing.md): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet (scripts/
# fetch-kubernetes.sh) on a containerd of line $line (scripts/fetch-containerd.sh), serving the
# simulated two-GPU node (fake /dev/nvidia0, nvidia1, nvidiactl; the mock NVML).
#
# Sourcing it runs the sourcing script again in a mount AND network namespace of its own
# (`unshare -m -n --propagation private`): everything the cluster
# writes outside its work directory goes to tmpfs mounts made in that namespace, at the paths a
# real node uses (/etc/containerd, /run, /var/lib/kubelet, /opt, /usr/local, ...), so the chart's
# installer and device plugin find the node where a real one has it, and nothing on the host
# changes: no host path, no iptables rule (no kube-proxy; the pod network is a bridge in this
# namespace), no sysctl (the values the kubelet would set are shown to it by bind-mounted
# files). The kubelet's cgroups live under a cgroup root named after the work directory and are
# removed at teardown.
#
# Defines: kubectl (admin), cluster_up, cluster_down (trap EXIT), restart_kubelet,
# containerd_restart_script; and $work, $kbin, $cbin, $node, $GPU (the node's GPU uuids).
# Needs $src, $build, $line; exits 77 (skip, saying why) when this machine cannot do it.
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
. "$src/scripts/lib/bundle.sh"
. "$src/scripts/lib/images.sh"

# The sourcing script runs again in a mount and network namespace of its own (once, before
# anything else happens), with the same arguments.
if [ -z "${GF_CLUSTER_NS:-}" ]; then
  [ "$(id -u)" = 0 ] || skip "needs root to run a kubelet and containerd"
  unshare -m -n --propagation private true 2>/dev/null || skip "no private mount and network namespace here (unshare -m -n)"
  GF_CLUSTER_NS=1 exec unshare -m -n --propagation private bash "$0" "$@"
fi

cluster_node=gf-node
cluster_ip=10.77.0.1      # the node's address: a dummy link in this namespace
service_ip=10.96.0.1      # the kubernetes Service (first of --service-cluster-ip-range)
pod_subnet=10.88.0.0/16   # the bridge's pods
driver_root=/opt/gpufence-test/driver  # the NVIDIA driver's root (chart value driver.root)
driver_lib=$driver_root/usr/lib/x86_64-linux-gnu

# --- what it needs ---------------------------------------------------------------------------
kbin=$(bash "$src/scripts/fetch-kubernetes.sh" 2>/dev/null) ||
  skip "kubernetes: $(cat "$build/kubernetes/FETCH-FAILED" 2>/dev/null || echo 'fetch failed')"
gf_line_field "$line" source >/dev/null || { echo "unknown containerd line '$line' (the lines: $(gf_lines | tr '\n' ' '))"; exit 2; }
cbin=$(gf_line_bin "$line") || skip "$cbin"
command -v runc >/dev/null || skip "runc is not installed"
[ -x /usr/lib/cni/bridge ] || skip "the CNI plugins are not installed (apt-get install containernetworking-plugins)"
command -v openssl >/dev/null || skip "openssl is not installed"
command -v ip >/dev/null || skip "iproute2 is not installed"
for b in gpufence gpufence-pause gpufence-probe gpufence-smi; do
  [ -x "$build/bin/$b" ] || skip "$build/bin/$b is not built"
done
why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"

work=$(gf_work_dir gpufence-cluster)
cgroup_root=/${work##*/}
pids=()
kubelet_pid="" containerd_pid=""
kubectl() { "$kbin/kubectl" --kubeconfig "$work/pki/admin.kubeconfig" "$@"; }
cluster_log() { echo "[cluster $(date -u +%T)] $*"; }

cluster_down() {
  local p c
  [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null
  # Every pod's containers, through containerd's own CLI, then containerd and the control plane.
  if [ -S /run/containerd/containerd.sock ]; then
    for c in $("$cbin/ctr" -n k8s.io containers ls -q 2>/dev/null); do
      "$cbin/ctr" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1
      "$cbin/ctr" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1
    done
  fi
  [ -f "$work/containerd.pid" ] && kill "$(cat "$work/containerd.pid")" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for c in $(runc --root /run/containerd/runc/k8s.io list -q 2>/dev/null); do
    runc --root /run/containerd/runc/k8s.io delete --force "$c" >/dev/null 2>&1
  done
  pkill -KILL -f -- "-address /run/containerd/containerd.sock" 2>/dev/null
  sleep 0.3
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # The mounts of this namespace end with it; the cgroups do not.
  for c in /sys/fs/cgroup/*"$cgroup_root" /sys/fs/cgroup/"$cgroup_root"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  awk -v w="$work" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$work"
}
trap cluster_down EXIT
trap 'exit 143' INT TERM

# --- the node: private host paths, /dev with two GPUs, network ----------------------------------
# tmpfs over the node's writable trees, and a private copy of /etc (its files as the host's), so
# no directory is ever made on the host.
node_paths=(/run /opt /usr/local /var/lib /var/log)
private_node() {
  local p
  # Shared propagation inside this namespace (its mounts are copies, private to it), as systemd
  # makes / on a real node: pods' HostToContainer and Bidirectional volumes need it.
  mount --make-rshared / || { echo "cannot make / shared in this namespace"; return 1; }
  for p in "${node_paths[@]}"; do
    [ -d "$p" ] || { echo "$p is not a directory here"; return 1; }
    mount -t tmpfs -o mode=755 tmpfs "$p" || { echo "cannot mount a private $p"; return 1; }
  done
  cp -a /etc "$work/etc" && mount --bind "$work/etc" /etc || { echo "cannot make a private /etc"; return 1; }
  mkdir -p /etc/containerd /etc/cni /etc/cdi /etc/nri /etc/gpufence /var/lib/kubelet /var/lib/containerd \
    /var/log/pods /var/log/containers
  mkdir -p /run/lock /var/run/netns
  # /dev: the host's, with the GPU nodes a two-GPU node has (195:0, 195:1, 195:255).
  sh "$src/scripts/lib/private_dev.sh" "$work/dev" || { echo "cannot make a private /dev"; return 1; }
  # The kernel settings the kubelet wants (pkg/kubelet/cm: setupKernelTunables), shown to it as
  # already set, so it writes no sysctl of the host.
  local kv f v n
  mkdir -p "$work/sysctl"
  for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
    f=/proc/sys/${kv%%=*} v=${kv#*=}
    [ "$(cat "$f" 2>/dev/null)" = "$v" ] && continue
    n=${kv%%=*}
    echo "$v" > "$work/sysctl/${n//\//.}"
    mount --bind "$work/sysctl/${n//\//.}" "$f" || { echo "cannot show the kubelet $f = $v"; return 1; }
  done
  # Network: lo, the node's address and the kubernetes Service's on a link of their own (a bridge with no port; no kube-proxy:
  # the API server listens on 443 and the Service IP is local here, so pods reach it directly).
  ip link set lo up &&
    ip link add gf0 type bridge && ip addr add "$cluster_ip/24" dev gf0 && ip addr add "$service_ip/32" dev gf0 &&
    ip link set gf0 up || { echo "cannot make the node's network"; return 1; }
  # The pod network: a bridge with the host-local IPAM, no masquerade (no iptables rule).
  mkdir -p /opt/cni/bin /etc/cni/net.d
  cp /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback /opt/cni/bin/
  cat > /etc/cni/net.d/10-gpufence-test.conflist <<JSON
{"cniVersion": "1.0.0", "name": "gpufence-test", "plugins": [
  {"type": "bridge", "bridge": "gf-br0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_subnet"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
JSON
  echo "nameserver 127.0.0.1" > "$work/resolv.conf"
  # The driver as the GPU Operator's driver container lays it out (the chart's driver.root): a
  # root with the driver's libraries and their linker cache, the mock NVML as libnvidia-ml and
  # its GPU list beside it, stand-ins for the rest.
  local lib=$driver_root/usr/lib/x86_64-linux-gnu
  mkdir -p "$lib" "$driver_root/etc"
  cp "$build/lib/mock-nvml/default/libnvidia-ml.so.1" "$lib/libnvidia-ml.so.550.54.15"
  ln -s libnvidia-ml.so.550.54.15 "$lib/libnvidia-ml.so.1"
  echo 'int gpufence_stand_in;' | cc -shared -x c - -Wl,-soname,libcuda.so.1 -o "$lib/libcuda.so.550.54.15" ||
    { echo "cannot build the stand-in libcuda"; return 1; }
  ldconfig -r "$driver_root" -C /etc/ld.so.cache
  cp "$src/tools/mock-nvml/examples/two-rtx3080.json" "$lib/mock-nvml.json"
  node=$work/node
  gf_make_node_root "$node"
  mapfile -t GPU < <(gf_gpu_uuids)
  mkdir -p "$node/fakeproc"
  cp -a "$node/proc/driver/nvidia/gpus" "$node/fakeproc/gpus"
}

# --- certificates: a CA, the API server's serving cert, one client cert per component -----------
make_pki() {
  local d=$work/pki
  mkdir -p "$d"
  (
    cd "$d" || exit 1
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
      -days 2 -subj /CN=gpufence-test-ca 2>/dev/null || exit 1
    openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null || exit 1
    # cert NAME SUBJECT [SAN]
    cert() {
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null &&
        openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out "$1.crt" \
          ${3:+-extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3")} 2>/dev/null
    }
    cert apiserver /CN=kube-apiserver \
      "IP:$service_ip,IP:127.0.0.1,IP:$cluster_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost" || exit 1
    cert admin "/O=system:masters/CN=gpufence-test-admin" || exit 1
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" || exit 1
    cert kubelet "/O=system:nodes/CN=system:node:$cluster_node" || exit 1
    cert scheduler /CN=system:kube-scheduler || exit 1
    cert controller-manager /CN=system:kube-controller-manager || exit 1
    for who in admin kubelet scheduler controller-manager; do
      cat > "$who.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:443", certificate-authority: $d/ca.crt}}]
users: [{name: $who, user: {client-certificate: $d/$who.crt, client-key: $d/$who.key}}]
contexts: [{name: test, context: {cluster: test, user: $who}}]
current-context: test
YAML
    done
  ) || { echo "cannot make the cluster's certificates"; return 1; }
}

# --- containerd: the user's config (the line's default with the offline pause image, and
# restrict_oom_score_adj, as for a rootless node: this VM gives root no CAP_SYS_RESOURCE, so runc
# cannot lower a pod's oom_score_adj below containerd's own) -----------------------------------
write_containerd_config() {
  "$cbin/containerd" config default > /etc/containerd/config.toml 2>/dev/null
  sed -i -E \
    -e "s|sandbox_image = .*|sandbox_image = \"$GF_PAUSE_IMAGE\"|" \
    -e "s|^( *)sandbox = .*|\1sandbox = \"$GF_PAUSE_IMAGE\"|" \
    -e "s|restrict_oom_score_adj = false|restrict_oom_score_adj = true|" \
    /etc/containerd/config.toml
  cp /etc/containerd/config.toml "$work/containerd-config.user"
}
# containerd_restart_script: the command the chart's installer runs to restart containerd (as
# systemctl restart would); it enters this namespace through --host-pid.
containerd_restart_script() {
  cat > "$work/restart-containerd.sh" <<SH
#!/bin/sh
p=\$(cat "$work/containerd.pid" 2>/dev/null)
if [ -n "\$p" ]; then kill "\$p" 2>/dev/null; i=0; while kill -0 "\$p" 2>/dev/null && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i + 1)); done; fi
echo restart >> "$work/containerd.restarts"
PATH=$cbin:\$PATH setsid "$cbin/containerd" --config /etc/containerd/config.toml >> "$work/containerd.log" 2>&1 < /dev/null &
echo \$! > "$work/containerd.pid"
SH
  chmod +x "$work/restart-containerd.sh"
}
start_containerd() {
  sh "$work/restart-containerd.sh"
  : > "$work/containerd.restarts"
  local _
  for _ in $(seq 150); do "$cbin/ctr" version >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "containerd $line does not start: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"; return 1
}

# --- the control plane -------------------------------------------------------------------------
start_control_plane() {
  local d=$work/pki
  "$kbin/etcd" --name gf --data-dir "$work/etcd" --listen-client-urls http://127.0.0.1:2379 \
    --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster gf=http://127.0.0.1:2380 \
    --unsafe-no-fsync --log-level warn > "$work/etcd.log" 2>&1 &
  pids+=($!)
  disown $!
  "$kbin/kube-apiserver" --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --secure-port 443 \
    --advertise-address "$cluster_ip" --service-cluster-ip-range 10.96.0.0/24 \
    --client-ca-file "$d/ca.crt" --tls-cert-file "$d/apiserver.crt" --tls-private-key-file "$d/apiserver.key" \
    --kubelet-client-certificate "$d/apiserver-kubelet-client.crt" --kubelet-client-key "$d/apiserver-kubelet-client.key" \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$d/sa.pub" \
    --service-account-signing-key-file "$d/sa.key" --authorization-mode Node,RBAC \
    --kubelet-preferred-address-types InternalIP --enable-admission-plugins NodeRestriction --allow-privileged=true --cert-dir "$work/apiserver" \
    > "$work/kube-apiserver.log" 2>&1 &
  pids+=($!)
  disown $!
  local _
  for _ in $(seq 600); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.1; done
  kubectl get --raw /readyz >/dev/null 2>&1 || { echo "kube-apiserver is not ready: $(tail -3 "$work/kube-apiserver.log" | tr '\n' ' ')"; return 1; }
  "$kbin/kube-controller-manager" --kubeconfig "$d/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$d/controller-manager.kubeconfig" --authorization-kubeconfig "$d/controller-manager.kubeconfig" \
    --service-account-private-key-file "$d/sa.key" --root-ca-file "$d/ca.crt" --use-service-account-credentials \
    --leader-elect=false --bind-address 127.0.0.1 > "$work/kube-controller-manager.log" 2>&1 &
  pids+=($!)
  disown $!
  "$kbin/kube-scheduler" --kubeconfig "$d/scheduler.kubeconfig" --authentication-kubeconfig "$d/scheduler.kubeconfig" \
    --authorization-kubeconfig "$d/scheduler.kubeconfig" --leader-elect=false --bind-address 127.0.0.1 \
    > "$work/kube-scheduler.log" 2>&1 &
  pids+=($!)
  disown $!
}

# --- the kubelet -------------------------------------------------------------------------------
write_kubelet_config() {
  local s
  # The cgroup root the kubelet puts kubepods under, in every v1 hierarchy (or the v2 one).
  if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then mkdir -p "/sys/fs/cgroup$cgroup_root"
  else
    for s in /sys/fs/cgroup/*/; do [ -L "${s%/}" ] || mkdir -p "$s${cgroup_root#/}"; done
    # v1's cpuset starts a new group with no CPUs and no memory nodes (no task could join it):
    # the parent's, as systemd gives the slices it makes.
    for s in cpus mems; do
      [ -f "/sys/fs/cgroup/cpuset$cgroup_root/cpuset.$s" ] &&
        cat "/sys/fs/cgroup/cpuset/cpuset.$s" > "/sys/fs/cgroup/cpuset$cgroup_root/cpuset.$s"
    done
  fi
  cat > "$work/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $work/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
resolvConf: $work/resolv.conf
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
nodeStatusReportFrequency: 5s
nodeStatusUpdateFrequency: 2s
YAML
}
start_kubelet() {
  PATH=$cbin:$PATH "$kbin/kubelet" --config "$work/kubelet.yaml" --kubeconfig "$work/pki/kubelet.kubeconfig" \
    --hostname-override "$cluster_node" --node-ip "$cluster_ip" --root-dir /var/lib/kubelet \
    --node-labels nvidia.com/gpu.present=true >> "$work/kubelet.log" 2>&1 &
  kubelet_pid=$!
  disown "$kubelet_pid"
}
# restart_kubelet: as systemctl restart kubelet (pods keep running).
restart_kubelet() {
  kill "$kubelet_pid" 2>/dev/null
  while kill -0 "$kubelet_pid" 2>/dev/null; do sleep 0.05; done
  start_kubelet
}
wait_node_ready() {
  local _
  for _ in $(seq "${1:-600}"); do
    [ "$(kubectl get node "$cluster_node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && return 0
    sleep 0.1
  done
  return 1
}

# cluster_up: node, certificates, containerd (with the test images), control plane, kubelet;
# returns when the node is Ready (the seconds in $node_ready_s).
cluster_up() {
  local t0
  t0=$(date +%s.%N)
  private_node || return 1
  make_pki || return 1
  write_containerd_config
  containerd_restart_script
  start_containerd || return 1
  gf_test_images "$work/images" "$build/bin/gpufence-pause" "$build/bin/gpufence-probe"
  gf_seed_app_image "$work/images" "$build/bin/gpufence-smi" "$src/tools/deepstream-stand-in/deepstream-app"
  gf_import_images "$cbin/ctr" /run/containerd/containerd.sock "$work/images" >/dev/null ||
    { echo "cannot import the test images"; return 1; }
  start_control_plane || return 1
  write_kubelet_config
  start_kubelet
  wait_node_ready || { echo "node $cluster_node not Ready: $(grep -E '^E[0-9]{4} ' "$work/kubelet.log" | tail -3)"; return 1; }
  # Pods are admitted once the controller manager made the namespace's service account.
  local _
  for _ in $(seq 300); do kubectl -n default get serviceaccount default >/dev/null 2>&1 && break; sleep 0.1; done
  node_ready_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  cluster_log "node $cluster_node Ready on containerd $("$cbin/containerd" --version | awk '{print $3}'), kubernetes $("$kbin/kubelet" --version | awk '{print $2}') in $node_ready_s s"
}
