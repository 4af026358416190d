#!/usr/bin/env bash
# gpufence-nri through containerd's CRI with NO runtimeClassName: the test kubelet
# (gpufence-test-cri) runs GPU pods admitted by the real gpufence-device-plugin through a private
# containerd of the line with NRI on, its default runtime plain runc, and gpufence-nri connected
# to the NRI socket. docs/nri.md.
# Cases:
#   isolation  unprivileged pods: each opens only its GPU (ENXIO), the other GPU has no node
#              (ENOENT) and a mknod of it does not open; privileged pods and privileged pods
#              with NVIDIA_VISIBLE_DEVICES=all and no GPU: on NRI >= v0.10 (2.3) the appended
#              device rules keep them to their GPU (the other one EPERM, even after mknod: the
#              measured answer to "does an appended deny beat a privileged container's
#              allow-all with runc"); below v0.10 (1.7, 2) the documented gap: they still reach
#              it, and gpufence-nri logs the gap. The same pods with no plugin running leak, so
#              the test fails without gpufence-nri. A plain pod (no GPU) gets only the
#              cgroup-mounts check hook every unprivileged container gets from the shim too.
#   restart    containerd restarts under a running gpufence-nri: it reconnects, and the next
#              pods are isolated again.
#   launched   containerd starts gpufence-nri itself (plugin_path/10-gpufence-nri, fd 3 in
#              NRI_PLUGIN_SOCKET, its runtime.toml as the plugin config from conf.d): same checks.
#   apps       the seed's checks 2b and 3: two deepstream-apps through gpufence launch list one
#              GPU each, their own, and run on it (privileged on 2.3, unprivileged below).
#   pod-annotation  a privileged pod asking for no GPU forges the device plugin's CDI annotation
#              under a broad pod_annotations (containerd copies it into the spec): the key is on
#              the pod and the container, so its create is refused; a GPU pod beside it runs.
#   down       what the doctor says about gpufence-nri (no required_plugins): with it up, nothing;
#              stopped, nri.plugin-down; a GPU pod created meanwhile is named once the plugin is
#              back (nri.created-while-down: its next Synchronize judges every container that
#              carries no decision of its own), the pod created while it was up is not.
#   required   (2.3) default_validator.required_plugins = ["gpufence-nri"]: with the plugin
#              down every GPU pod's create fails; with it up they run; killed mid-run, the next
#              create fails again.
#   hostile-path  security round 4: a pod whose HostToContainer volume of the host's cgroupfs is
#              mounted at a ~930 KB path of C1 controls (the answer that once exceeded ttrpc's
#              4 MiB and ended the plugin): refused with a bounded message, gpufence-nri stays
#              up and connected, the next pods are decided and isolated.
#   many-mounts  six GPU pods of 24,000 volume mounts each: every one refused at once (over the
#              limit), gpufence-nri's threads and RSS back to their idle figures within a
#              second, still connected, the next pods decided.
#   fence      (2.3, 2.4) gpufence-nri and gpufence-fence launched from plugin_path,
#              required_plugins = both, and the pod waiver configured as a careless install
#              would: a stopped decider (SIGSTOP), one killed mid-request and one killed (SIGKILL)
#              each fail the next privileged GPU pod's create (also with the waiver), the keeper brings
#              the decider back within seconds with no containerd restart (measured), and pods
#              are isolated again; a killed fence fails creates until it is back too.
# Usage: cri_nri.sh LINE CASE    LINE = 1.7 | 2 | 2.2 | 2.3 | 2.4
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_nri.sh LINE CASE}
case_name=${2:?usage: cri_nri.sh LINE CASE}
GF_CRI_WORK_PREFIX=gpufence-cri-nri
GF_CRI_NRI=1
[ -x "$build/bin/gpufence-nri" ] || { echo "SKIP: $build/bin/gpufence-nri is not built"; exit 77; }
if [ "$case_name" = required ]; then
  gf_line_has "$line" nri-required || skip "required_plugins needs NRI >= v0.10 (containerd 2.2+)"
  gf_cri_edit_config() {  # nri@v0.12.0:plugins/default-validator/default-validator.go
    sed -i -E "/default_validator\]/,/tolerate_missing/ {
      s/^( *)enable = false/\1enable = true/
      s/^( *)required_plugins = \[\]/\1required_plugins = ['gpufence-nri']/ }" "$1"
    grep -q "required_plugins = \['gpufence-nri'\]" "$1"
  }
fi
if [ "$case_name" = fence ]; then
  gf_line_has "$line" nri-required || skip "a validator needs NRI >= v0.10 (containerd 2.2+)"
  gf_cri_edit_config() {  # both launched; required_plugins both; a waiver a pod can set
    mkdir -p "$work/nri/plugins" "$work/nri/conf.d"
    ln -s "$build/bin/gpufence-nri" "$work/nri/plugins/10-gpufence-nri"
    ln -s "$build/bin/gpufence-nri" "$work/nri/plugins/20-gpufence-fence"
    sed -e "s|^file = .*|file = \"$work/nri.log\"|" \
      -e "s|^\[nri\]\$|[nri]\nsocket = \"$work/nri/nri.sock\"|" "$work/runtime.toml" > "$work/nri-launched.toml"
    grep -q "^socket = \"$work/nri/nri.sock\"" "$work/nri-launched.toml" || return 1
    cp "$work/nri-launched.toml" "$work/nri/conf.d/10-gpufence-nri.conf"
    cp "$work/nri-launched.toml" "$work/nri/conf.d/20-gpufence-fence.conf"
    # The keeper's servers read runtime.toml from the environment containerd gives its plugins.
    export GPUFENCE_RUNTIME_CONFIG=$work/nri-launched.toml
    sed -i -E "/default_validator\]/,/tolerate_missing/ {
      s/^( *)enable = false/\1enable = true/
      s/^( *)required_plugins = \[\]/\1required_plugins = ['gpufence-nri', 'gpufence-fence']/
      s/^( *)tolerate_missing_plugins_annotation = ''/\1tolerate_missing_plugins_annotation = 'gpufence.io\/tolerate-missing-nri'/ }" "$1"
    grep -q "required_plugins = \['gpufence-nri', 'gpufence-fence'\]" "$1" &&
      grep -q "tolerate_missing_plugins_annotation = 'gpufence.io/tolerate-missing-nri'" "$1"
  }
fi
if [ "$case_name" = pod-annotation ]; then
  gf_cri_edit_config() {  # every runtime copies cdi.k8s.io/ pod annotations into the spec
    sed -i -E "s/^( *)pod_annotations = \[\]/\1pod_annotations = ['cdi.k8s.io\/*']/" "$1"
    grep -q "pod_annotations = \['cdi.k8s.io/\*'\]" "$1"
  }
fi
if [ "$case_name" = launched ]; then
  gf_cri_edit_config() {  # containerd starts plugin_path/NN-name with fd 3, conf from conf.d
    mkdir -p "$work/nri/plugins" "$work/nri/conf.d"
    ln -s "$build/bin/gpufence-nri" "$work/nri/plugins/10-gpufence-nri"
    sed "s|^file = .*|file = \"$work/nri.log\"|" "$work/runtime.toml" > "$work/nri/conf.d/10-gpufence-nri.conf"
  }
fi
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
# shellcheck source=scripts/lib/seed_pods.sh
. "$src/scripts/lib/seed_pods.sh"
rules_apply=false
gf_line_has "$line" nri-required && rules_apply=true

# gpufence-nri's own config: the node's, logging to its own file.
# (debug: each adjustment is logged too, for a failing run to show what was sent)
sed "s|^file = .*|file = \"$work/nri.log\"\nlevel = \"debug\"|" "$work/runtime.toml" > "$work/nri.toml"
grep -q "^file = \"$work/nri.log\"" "$work/nri.toml" || { echo "cannot point gpufence-nri's log"; exit 2; }
nri_pid=""
start_nri() {  # returns once it has registered and synchronized
  local seen n _
  seen=$(grep -c 'nri.synchronized' "$work/nri.log" 2>/dev/null); seen=${seen:-0}
  GPUFENCE_RUNTIME_CONFIG=$work/nri.toml "$build/bin/gpufence-nri" --socket "$work/nri/nri.sock" \
    --hook-binary "$build/bin/gpufence-runtime" 2>> "$work/nri.stderr" &
  nri_pid=$!
  for _ in $(seq 100); do
    n=$(grep -c 'nri.synchronized' "$work/nri.log" 2>/dev/null)
    [ "${n:-0}" -gt "$seen" ] && return 0
    sleep 0.1
  done
  echo "gpufence-nri did not register:"; cat "$work/nri.stderr" "$work/nri.log" 2>/dev/null | tail -5
  return 1
}
stop_nri() { [ -n "$nri_pid" ] && kill "$nri_pid" 2>/dev/null && wait "$nri_pid" 2>/dev/null; nri_pid=""; }
stop_keepers() {  # the keepers and what they started (detached: not in any job of ours)
  pkill -KILL -f -- "--socket $work/nri/nri.sock" 2>/dev/null
}
trap 'stop_nri; stop_keepers; cleanup' EXIT
decisions() { grep -c "nri.decision" "$work/nri.log" 2>/dev/null || echo 0; }

# isolated NAME: both pods ran, hold different GPUs, each opens only its own.
isolated() {
  local name=$1 p own other
  check "$name: both pods ran" test "$(cat "$work/$name.rc")" = 0
  check "$name: the pods hold different GPUs" test "$(gpu_of "$name" 0)$(gpu_of "$name" 1)" = 01 -o "$(gpu_of "$name" 0)$(gpu_of "$name" 1)" = 10
  for p in 0 1; do
    own=$(gpu_of "$name" $p); other=$((1 - ${own/\?/0}))
    check "$name: pod $p opens its GPU $own" test "$(result "$name" $p /dev/nvidia$own)" = ENXIO
    check "$name: pod $p cannot open GPU $other even after mknod" test "$(result "$name" $p /tmp/n$other)" != ENXIO -a -n "$(result "$name" $p /tmp/n$other)"
    check "$name: pod $p sees only its GPU in CUDA_VISIBLE_DEVICES" grep -qx "pod $p exec CVD=${GPU[${own/\?/0}]}" "$work/$name.out"
  done
}
# leaks NAME: the other GPU opens in every pod (no enforcement).
leaks() {
  local name=$1 p own other
  check "$name: both pods ran" test "$(cat "$work/$name.rc")" = 0
  for p in 0 1; do
    own=$(gpu_of "$name" $p); other=$((1 - ${own/\?/0}))
    check "$name: pod $p reaches GPU $other" test "$(result "$name" $p /tmp/n$other)" = ENXIO
  done
}

case $case_name in  # gf:cases
  isolation)
    start_nri || exit 1
    echo "== unprivileged GPU pods, no runtimeClassName, gpufence-nri on"
    run_pods unpriv "" 2
    isolated unpriv
    for p in 0 1; do
      own=$(gpu_of unpriv $p); other=$((1 - ${own/\?/0}))
      check "unpriv: pod $p has no node for GPU $other" test "$(result unpriv $p /dev/nvidia$other)" = ENOENT
    done
    check "unpriv: gpufence-nri decided both, from the kubelet's channels" \
      test "$(grep -cE 'nri.decision .*channel=(device-specs|cdi-annotations) .*granted=GPU-' "$work/nri.log")" -ge 2

    echo "== privileged GPU pods (the seed's), gpufence-nri on"
    run_pods priv "" 2 --privileged
    echo "== privileged GPU pods with both GPUs' nodes in their /dev (the seed's host /dev), gpufence-nri on"
    run_pods hostdev "" 2 --privileged "${host_dev[@]}"
    echo "== privileged pods, no GPU, NVIDIA_VISIBLE_DEVICES=all in their env, gpufence-nri on"
    run_pods envall "" 2 --privileged --gpus 0 --env NVIDIA_VISIBLE_DEVICES=all
    if $rules_apply; then
      isolated priv
      for p in 0 1; do
        for m in 0 1; do
          # The measured answer (runc 1.1.5, cgroup v1): the appended deny-all + whitelist beats
          # the privileged container's allow-all: the mknod'd node opens with EPERM.
          check "envall: pod $p cannot open GPU $m after mknod (appended deny beats allow-all)" \
            test "$(result envall $p /tmp/n$m)" = EPERM
        done
      done
      for p in 0 1; do
        own=$(gpu_of hostdev $p); other=$((1 - ${own/\?/0}))
        check "hostdev: pod $p opens its GPU $own" test "$(result hostdev $p /dev/nvidia$own)" = ENXIO
        # The node stays (NRI does not forward a device removal); the appended rules deny it.
        check "hostdev: pod $p's node of GPU $other is denied (EPERM)" test "$(result hostdev $p /dev/nvidia$other)" = EPERM
      done
      check "priv: gpufence-nri appended the whitelist" grep -q 'nri.decision .*privileged=true .*whitelist=true rules=appended' "$work/nri.log"
    else
      # NRI < v0.10 ignores device rules: the documented limit, shown.
      leaks priv
      for p in 0 1; do
        own=$(gpu_of hostdev $p); other=$((1 - ${own/\?/0}))
        check "hostdev: pod $p still opens GPU $other's node (NRI < v0.10: the gap)" test "$(result hostdev $p /dev/nvidia$other)" = ENXIO
      done
      for p in 0 1; do
        check "envall: pod $p still reaches GPU 0 (NRI < v0.10: the privileged gap)" test "$(result envall $p /tmp/n0)" = ENXIO
      done
      check "gpufence-nri logged the privileged gap" grep -q 'nri.decision .*privileged=true .*rules=not-applied .*gaps=' "$work/nri.log"
    fi

    echo "== forged channels: no GPU allocated, NVIDIA_VISIBLE_DEVICES=all and a mount marker of GPU 1"
    run_pods forged "" 1 --gpus 0 --env NVIDIA_VISIBLE_DEVICES=all --volume "/dev/null:/var/run/nvidia-container-devices/${GPU[1]}"
    check "forged: the pod ran" test "$(cat "$work/forged.rc")" = 0
    for m in 0 1; do
      check "forged: GPU $m has no node" test "$(result forged 0 /dev/nvidia$m)" = ENOENT
      check "forged: GPU $m does not open after mknod" test "$(result forged 0 /tmp/n$m)" != ENXIO -a -n "$(result forged 0 /tmp/n$m)"
    done
    check "forged: gpufence-nri granted nothing" grep -qE 'nri.decision .*pod=default/forged-0 .*granted=""' "$work/nri.log"
    check "forged: and said what it ignored" grep -qE 'nri.ignored .*mount marker.*NVIDIA_VISIBLE_DEVICES=all|nri.ignored .*NVIDIA_VISIBLE_DEVICES=all.*marker' "$work/nri.log"

    echo "== a plain pod (no GPU, unprivileged): nothing granted or denied"
    RUN_EXEC='echo CVD=$CUDA_VISIBLE_DEVICES' run_pods plain "" 1 --gpus 0
    check "plain: the pod ran" test "$(cat "$work/plain.rc")" = 0
    # No GPU, nothing granted, no rule, node or env touched; the one addition is the shim's
    # cgroup-mounts check hook, which every unprivileged container gets (CRI mounts a cgroupfs
    # in each): docs/nri.md.
    check "plain: gpufence-nri granted nothing and left the rules" grep -qE 'nri.decision .*pod=default/plain-0 .*granted="" .*rules=unchanged' "$work/nri.log"
    id=$(grep -E 'nri.decision .*pod=default/plain-0 ' "$work/nri.log" | sed -E 's/.* container=([0-9a-f]+) .*/\1/')
    adj=$(grep "nri.adjustment container=$id " "$work/nri.log")
    check "plain: its adjustment is the cgroup-mounts hook alone" \
      bash -c '[[ "$1" == *"hook\\x22 args: \\x22cgroup-mounts"* && "$1" != *"env {"* && "$1" != *"linux {"* && "$1" != *"mounts {"* ]]' _ "$adj"

    stop_nri
    echo "== the same privileged pods with gpufence-nri NOT running (must leak)"
    run_pods leak "" 2 --privileged
    leaks leak
    ;;

  restart)
    start_nri || exit 1
    echo "== containerd restarts under gpufence-nri"
    restart_containerd
    for _ in $(seq 100); do [ "$(grep -c 'nri.synchronized' "$work/nri.log")" -ge 2 ] && break; sleep 0.1; done
    check "gpufence-nri reconnected and synchronized again" test "$(grep -c 'nri.synchronized' "$work/nri.log")" -ge 2
    run_pods after-restart "" 2 --privileged
    if $rules_apply; then isolated after-restart; else check "after-restart: decided" test "$(decisions)" -ge 2; fi
    ;;

  launched)
    echo "== gpufence-nri started by containerd from plugin_path (fd 3), its config from conf.d"
    for _ in $(seq 100); do grep -q 'nri.synchronized' "$work/nri.log" 2>/dev/null && break; sleep 0.1; done
    check "containerd launched gpufence-nri, which took its conf.d config" grep -q 'nri.configured runtime=containerd' "$work/nri.log"
    run_pods launched-unpriv "" 2
    isolated launched-unpriv
    run_pods launched-priv "" 2 --privileged
    if $rules_apply; then isolated launched-priv; else leaks launched-priv; fi
    check "launched: every pod decided" test "$(decisions)" -ge 4
    ;;

  apps)
    # The seed's checks 2b and 3 with no runtimeClassName: two deepstream-apps through
    # `gpufence launch`, each listing one GPU (its own) and running on it, one process per GPU on
    # the host, the doctor silent. The seed's own pods are privileged: from NRI v0.10 (2.3) they
    # are narrowed too; below it (1.7, 2) the pods are unprivileged, the part NRI can keep there.
    start_nri || exit 1
    priv=()
    $rules_apply && priv=(--privileged "${host_dev[@]}")
    echo "== the seed's apps through gpufence launch, no runtimeClassName${priv:+, privileged}"
    : > "$work/acct/processes"
    RUN_IMAGE=$GF_SEED_APP_IMAGE RUN_EXEC=$seed_exec RUN_WHILE=look \
      run_pods apps "" 2 "${priv[@]}" "${seed_pod[@]}" --shell "$(seed_shell "$launch")"
    seed_isolated apps
    sed 's/^/  [apps list] /' "$work/apps.list"
    ;;

  pod-annotation)
    # A trusted key on the pod and on the container (docs/nri.md): a pod annotation containerd
    # copied into the spec cannot be told from the device plugin's, so the create is refused. A
    # privileged pod that asks for no GPU forges the plugin's annotation for GPU 1 under a broad
    # pod_annotations: trusted, it would be granted GPU 1.
    start_nri || exit 1
    kind=$(sed -n 's/.*kCdiKind = "\([^"]*\)".*/\1/p' "$src/src/gpu/wire_contract.hpp")
    echo "== a privileged pod, no GPU, forged cdi.k8s.io/x: $kind=${GPU[1]}, gpufence-nri on"
    run_pods forged "" 1 --privileged --gpus 0 --pod-annotation "cdi.k8s.io/x=$kind=${GPU[1]}"
    check "forged: the pod's create failed" test "$(cat "$work/forged.rc")" != 0
    check "forged: the stand-in allocated nothing" grep -qx "node capacity 2 allocated 0" "$work/forged.out"
    check "forged: gpufence-nri refused it, naming the key on both" grep -q "nri.refused .*forged-0.*cdi.k8s.io/x is set on the pod and on the container" "$work/nri.log"
    check "forged: and granted nothing" bash -c "! grep 'nri.decision .*forged-0' '$work/nri.log' | grep -q 'granted=GPU-'"
    run_pods honest "" 1
    check "honest: a GPU pod next to it is decided and runs" test "$(cat "$work/honest.rc")" = 0
    ;;

  down)
    printf '{"enforcement": "nri"}\n' > "$work/install-state.json"
    nri_doctor() {  # nri_doctor OUT: this node's doctor, gpufence-nri's status and install record
      "$build/bin/gpufence" doctor --containerd-config "$cfg" --runc-root "$runc_root" \
        --pod-resources-socket "$work/absent.sock" --install-state "$work/install-state.json" \
        --nri-status "$work/nri-status.json" > "$work/$1" 2>&1
    }
    judged() {  # the judgement of the last Synchronize names pod $1 (or times out)
      local _
      for _ in $(seq 100); do grep -q "\"pod\": \"default/$1\"" "$work/nri-status.json" 2>/dev/null && return 0; sleep 0.1; done
      return 1
    }
    while_down() {  # the pods of "undecided" run, created while gpufence-nri was stopped
      start_nri || return 1
      check "undecided: gpufence-nri's next Synchronize names the pod created while it was down" judged undecided-0
      nri_doctor doctor-back
      check "back: the doctor does not say the plugin is down" bash -c "! grep -q nri.plugin-down '$work/doctor-back'"
      check "back: the doctor names the pod created while it was down" grep -qE 'nri.created-while-down.*pod default/undecided-0' "$work/doctor-back"
      check "back: and not the pod created while it was up" bash -c "! grep -E 'nri.created-while-down' '$work/doctor-back' | grep -q 'pod default/decided-0'"
      check "back: and says what gpufence-nri would have done" grep -qE 'would (narrow|grant)' "$work/doctor-back"
    }
    while_up() {  # the pod of "decided" runs, created while gpufence-nri was up
      nri_doctor doctor-up
      check "up: the doctor says nothing about gpufence-nri being down" bash -c "! grep -qE 'nri.(plugin-down|created-while-down)' '$work/doctor-up'"
      stop_nri
      nri_doctor doctor-down
      check "stopped: the doctor says gpufence-nri is not running" grep -qE 'nri.plugin-down.*not running' "$work/doctor-down"
      local k=$kubelet_pid p=$plugin_pid
      echo "== a privileged GPU pod created while gpufence-nri is stopped"
      RUN_WHILE=while_down run_pods undecided "" 1 --privileged
      kubelet_pid=$k plugin_pid=$p
    }
    start_nri || exit 1
    echo "== a privileged GPU pod created while gpufence-nri is up"
    RUN_WHILE=while_up run_pods decided "" 1 --privileged
    check "decided: the pod ran" test "$(cat "$work/decided.rc")" = 0
    check "undecided: the pod ran (no required_plugins)" test "$(cat "$work/undecided.rc")" = 0
    sed 's/^/  [doctor back] /' "$work/doctor-back" | grep nri. | head -10
    ;;

  hostile-path)
    start_nri || exit 1
    pid_before=$nri_pid
    python3 -c '
import sys
p = ""
while len(p.encode()) < 930000:
    p += "/" + "\u0080" * 127 + "/.."
p += "/data"
sys.stdout.write(p)' > "$work/c1path"
    # containerd takes HostToContainer only from a shared or slave source: the host's cgroupfs,
    # bound shared in containerd's own private mount namespace (nothing of the host's changes).
    mkdir -p "$work/cg"
    nsenter -t "$cd_pid" -m sh -c "mount --rbind /sys/fs/cgroup '$work/cg' && mount --make-rshared '$work/cg'" ||
      { echo "cannot bind the cgroupfs shared in containerd's namespace"; exit 1; }
    echo "== a GPU pod, the host's cgroupfs HostToContainer at a $(wc -c < "$work/c1path")-byte path of C1 controls"
    run_pods hostile "" 1 --volume "$work/cg:@$work/c1path:rw:host-to-container"
    check "hostile: the pod's create failed" test "$(cat "$work/hostile.rc")" != 0
    head -c 600 "$work/hostile.out"; echo
    check "hostile: gpufence-nri refused it" grep -q "nri.refused" "$work/nri.log"
    longest=$(grep "nri.refused" "$work/nri.log" | awk '{print length}' | sort -n | tail -1)
    check "hostile: the refusal is bounded (${longest:-0} bytes logged)" test "${longest:-0}" -lt 20000
    check "hostile: gpufence-nri still runs (same process)" kill -0 "$pid_before"
    check "hostile: its session did not end" bash -c "! grep -q 'nri.session_failed' '$work/nri.log'"
    run_pods after-hostile "" 2
    isolated after-hostile
    ;;

  many-mounts)
    start_nri || exit 1
    task_count() { ls "/proc/$nri_pid/task" | wc -l; }
    rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$nri_pid/status"; }
    idle_threads=$(task_count) idle_rss=$(rss_kb)
    mkdir -p "$work/vol"
    vols=()
    for i in $(seq 24000); do vols+=(--volume "$work/vol:/m/$i"); done
    echo "== six GPU pods of 24,000 mounts each, two at a time (gpufence-nri idle: $idle_threads threads, RSS $idle_rss kB)"
    t0=$(date +%s%N)
    for r in 1 2 3; do run_pods "many$r" "" 2 "${vols[@]}" --timeout 60; done
    t1=$(date +%s%N)
    check "many: every create failed" test "$(cat "$work"/many?.out | grep -c 'error CreateContainer')" -eq 6
    check "many: each refused over the limit" test "$(cat "$work"/many?.out | grep -c 'above gpufence-nri.s limit of 1024')" -eq 6
    echo "  six refusals in $(( (t1 - t0) / 1000000 )) ms (with the pods' sandboxes)"
    sleep 1
    check "many: gpufence-nri's threads are back to $idle_threads ($(task_count))" test "$(task_count)" -le "$idle_threads"
    check "many: its RSS is back within 8 MB of idle ($(rss_kb) kB)" test "$(rss_kb)" -lt $((idle_rss + 8192))
    check "many: its session did not end" bash -c "! grep -q 'nri.session_failed' '$work/nri.log'"
    run_pods after-many "" 2
    isolated after-many
    ;;

  fence)
    holder() { awk '{print $1}' "$work/keeper/$1.lock" 2>/dev/null; }
    # registered NAME COUNT: containerd configured the NAME plugin at least COUNT times (its
    # Configure line: written once its log is open; containerd may answer RegisterPlugin first).
    registered() {
      local _ n event=nri.configured
      [ "$1" = gpufence-fence ] && event=nri.fence_configured
      for _ in $(seq 400); do
        n=$(grep -c "event=$event " "$work/nri.log" 2>/dev/null)
        [ "${n:-0}" -ge "$2" ] && return 0
        sleep 0.05
      done
      return 1
    }
    check "containerd launched the decider" registered gpufence-nri 1
    check "containerd launched the fence" registered gpufence-fence 1
    check "the fence subscribed to validation" grep -q "nri.fence_configured" "$work/nri.log"
    run_pods up "" 2 --privileged
    isolated up
    echo "== the decider stopped (SIGSTOP): a privileged GPU pod with the waiver annotation"
    d=$(holder decider)
    kill -STOP "$d"
    run_pods stalled "" 1 --privileged --pod-annotation gpufence.io/tolerate-missing-nri=true --timeout 20
    check "stalled: the pod's create failed" test "$(cat "$work/stalled.rc")" != 0
    check "stalled: the fence or required_plugins refused it" grep -qE 'gpufence-fence|required plugin' "$work/stalled.out"
    t0=$(date +%s.%N)
    check "stalled: the keeper replaced the stopped decider" registered gpufence-nri 2
    t1=$(date +%s.%N)
    echo "  back $(awk "BEGIN {printf \"%.2f\", $t1 - $t0}") s after the refused create"
    kill -KILL "$d" 2>/dev/null
    run_pods back "" 2 --privileged
    isolated back
    echo "== the decider killed mid-request: stopped, a privileged GPU pod's create pending, then SIGKILL"
    d=$(holder decider)
    kill -STOP "$d"
    (run_pods midkill "" 1 --privileged --timeout 20) &
    mid=$!
    sleep 1
    kill -KILL "$d"
    wait "$mid"
    check "midkill: the pod's create failed" test "$(cat "$work/midkill.rc")" != 0
    check "midkill: refused by the fence or required_plugins" grep -qE 'gpufence-fence|required plugin' "$work/midkill.out"
    check "midkill: the keeper brought the decider back" registered gpufence-nri 3
    echo "== the decider killed (SIGKILL)"
    t0=$(date +%s.%N)
    kill -KILL "$(holder decider)"
    check "killed: the keeper brought the decider back" registered gpufence-nri 4
    t1=$(date +%s.%N)
    echo "  decider back $(awk "BEGIN {printf \"%.2f\", $t1 - $t0}") s after SIGKILL"
    run_pods again "" 2 --privileged
    isolated again
    echo "== the fence killed"
    kill -KILL "$(holder fence)"
    check "fence killed: the keeper brought it back" registered gpufence-fence 2
    run_pods fenced-again "" 2 --privileged
    isolated fenced-again
    check "no container was created undecided" bash -c "! grep -q 'nri.unenforced' '$work/nri.log'"
    ;;

  required)
    echo "== required_plugins = [gpufence-nri], gpufence-nri down: GPU pods must not be created"
    run_pods down "" 1
    check "down: the pod's create failed" test "$(cat "$work/down.rc")" != 0
    check "down: containerd names the missing plugin" grep -q "gpufence-nri" "$work/down.out"
    start_nri || exit 1
    echo "== gpufence-nri up: they run, isolated"
    run_pods up "" 2 --privileged
    isolated up
    echo "== gpufence-nri killed mid-run: the next GPU pod must not be created"
    kill -KILL "$nri_pid"; wait "$nri_pid" 2>/dev/null; nri_pid=""
    run_pods died "" 1 --privileged
    check "died: the pod's create failed" test "$(cat "$work/died.rc")" != 0
    check "died: containerd names the missing plugin" grep -q 'required plugin "gpufence-nri" not present' "$work/died.out"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac

echo "gpufence-nri's log:"
sed "s/^/  /" "$work/nri.log" 2>/dev/null | grep -v level=debug | head -40
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line ($case_name)"; tail -20 "$work/containerd.log"; exit 1; }
echo "containerd $line ($case_name): all checks passed"
