#!/usr/bin/env bash
# Scenario tests of gpufence-runtime with real runc: fake GPU nodes (char 195:N, no driver
# behind them) and a probe that opens them from inside the container.
#   ENXIO = the devices cgroup allowed the open, EPERM = denied, ENOENT = no such node.
# Usage: runtime.sh CASE   (each case is its own CTest test)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
. "$src/scripts/lib/bundle.sh"

[ "$(id -u)" = 0 ] || skip "needs root to run runc and mknod"
command -v runc >/dev/null || skip "runc is not installed (apt-get install runc)"
command -v busybox >/dev/null || [ -x /bin/busybox ] || skip "busybox-static is not installed"

why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"
case_name=${1:?usage: runtime.sh CASE}
work=$(gf_work_dir gpufence-scn)
state=$work/state
ids=()
cleanup() {
  local id
  for id in "${ids[@]}"; do runc --root "$state" delete --force "$id" >/dev/null 2>&1; done
  # Mounts a case made below $work (cgroupfs-propagation) go first: rm must never walk a cgroupfs.
  awk -v w="$work" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# A GPU the container made itself with mknod is denied by the cgroup: either mknod fails (a deny
# rule with "m") or the open does (default-deny without an allow).
mknod_denied() { has_line "$1" "/tmp/n0 EPERM" >/dev/null || has_line "$1" "/tmp/n0 MKNOD_EPERM"; }
has_line() { grep -qxF -- "$2" <<<"$1" || { echo "  expected line '$2' in:"; sed 's/^/    | /' <<<"$1"; return 1; }; }

node=$work/node
gf_make_node_root "$node"
nvml_cfg=$src/tools/mock-nvml/examples/two-rtx3080.json
mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)
GPU0=${GPU[0]} GPU1=${GPU[1]}
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
export MOCK_NVML_CONFIG=$nvml_cfg
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
shim=$build/bin/gpufence-runtime
probe_args='["/bin/sh","-c","gpufence-probe /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl; if mknod /tmp/n0 c 195 0 2>/tmp/mknod.err; then gpufence-probe /tmp/n0; else grep -q \"not permitted\" /tmp/mknod.err && echo \"/tmp/n0 MKNOD_EPERM\"; fi; echo NVD=$NVIDIA_VISIBLE_DEVICES; echo CVD=$CUDA_VISIBLE_DEVICES"]'

# new_bundle NAME MODE ENV MOUNTS ANNOTATIONS [ARGS] [KUBELET_MINORS]
#   KUBELET_MINORS: the GPUs the kubelet gave as DeviceSpecs ("1", "0 1"), as containerd writes them.
new_bundle() {
  local b=$work/$1
  mkdir -p "$b"
  gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
  gf_write_spec "$b" "$2" "${6:-$probe_args}" "$3" "$4" "$5" "$node" "${7:-}"
  echo "$b"
}
# run_with RUNTIME BUNDLE ID: runs the container to completion, prints its output.
run_with() {
  ids+=("$3")
  "$1" --root "$state" run --bundle "$2" "$3" 2>"$work/$3.err"
}

case $case_name in  # gf:cases
  mount-marker)
    # What the kubelet does with the plugin's default answer: device spec + marker for GPU 1.
    b=$(new_bundle c1 unprivileged "" "$(gf_marker_mount $GPU1)" "" "" 1)
    out=$(run_with "$shim" "$b" mm1)
    check "allocated GPU 1 opens (ENXIO)" has_line "$out" "/dev/nvidia1 ENXIO"
    check "GPU 0 is absent" has_line "$out" "/dev/nvidia0 ENOENT"
    check "control node is present" has_line "$out" "/dev/nvidiactl ENXIO"
    check "mknod'ed GPU 0 is denied by the cgroup" mknod_denied "$out"
    check "NVIDIA_VISIBLE_DEVICES names the UUID" has_line "$out" "NVD=$GPU1"
    check "CUDA_VISIBLE_DEVICES names the UUID" has_line "$out" "CVD=$GPU1"
    check "decision logged" grep -q "event=runtime.decision container=mm1 command=run channel=device-specs privileged=false passthrough=false granted=$GPU1" "$work/runtime.log"
    ;;
  cdi-annotation)
    b=$(new_bundle c1 unprivileged "" "" "\"cdi.k8s.io/gpufence_x\":\"nvidia.com/gpu=0\"")
    out=$(run_with "$shim" "$b" cdi1)
    check "GPU 0 by CDI annotation opens" has_line "$out" "/dev/nvidia0 ENXIO"
    check "GPU 1 absent" has_line "$out" "/dev/nvidia1 ENOENT"
    check "env names GPU 0" has_line "$out" "NVD=$GPU0"
    ;;
  two-containers)
    # Both running at once, each created through the shim; probed with exec; then state, kill,
    # delete all pass through the shim to runc.
    sleeper='["/bin/sleep","60"]'
    b0=$(new_bundle a unprivileged "" "$(gf_marker_mount $GPU0)" "" "$sleeper" 0)
    b1=$(new_bundle b unprivileged "" "$(gf_marker_mount $GPU1)" "" "$sleeper" 1)
    ids+=(two-a two-b)
    check "create A" "$shim" --root "$state" create --bundle "$b0" two-a </dev/null >/dev/null 2>"$work/a.err"
    check "create B" "$shim" --root "$state" create --bundle "$b1" two-b </dev/null >/dev/null 2>"$work/b.err"
    check "start A" "$shim" --root "$state" start two-a
    check "start B" "$shim" --root "$state" start two-b
    st=$("$shim" --root "$state" state two-a)
    check "state passes through" grep -q '"status": "running"' <<<"$st"
    pa=$("$shim" --root "$state" exec two-a /bin/gpufence-probe /dev/nvidia0 /dev/nvidia1)
    pb=$("$shim" --root "$state" exec two-b /bin/gpufence-probe /dev/nvidia0 /dev/nvidia1)
    check "A reaches GPU 0" has_line "$pa" "/dev/nvidia0 ENXIO"
    check "A does not see GPU 1" has_line "$pa" "/dev/nvidia1 ENOENT"
    check "B reaches GPU 1" has_line "$pb" "/dev/nvidia1 ENXIO"
    check "B does not see GPU 0" has_line "$pb" "/dev/nvidia0 ENOENT"
    check "kill passes through" "$shim" --root "$state" kill two-a KILL
    check "kill B" "$shim" --root "$state" kill two-b KILL
    for _ in $(seq 200); do
      runc --root "$state" state two-a | grep -q '"status": "stopped"' && runc --root "$state" state two-b | grep -q '"status": "stopped"' && break
      sleep 0.05
    done
    check "delete passes through" "$shim" --root "$state" delete two-a
    check "delete B" "$shim" --root "$state" delete two-b
    check "deleted container is gone" bash -c "! runc --root '$state' state two-a >/dev/null 2>&1"
    ;;
  env-all-unprivileged)
    b=$(new_bundle c1 unprivileged '"NVIDIA_VISIBLE_DEVICES=all"' "" "")
    out=$(run_with "$shim" "$b" envall)
    check "no GPU 0" has_line "$out" "/dev/nvidia0 ENOENT"
    check "no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
    check "mknod'ed GPU denied" mknod_denied "$out"
    check "all rewritten to void" has_line "$out" "NVD=void"
    ;;
  privileged-allocated)
    b=$(new_bundle c1 privileged '"NVIDIA_VISIBLE_DEVICES=all"' "$(gf_marker_mount $GPU1)" "")
    out=$(run_with "$shim" "$b" priv1)
    check "GPU 1 opens" has_line "$out" "/dev/nvidia1 ENXIO"
    check "GPU 0 node removed" has_line "$out" "/dev/nvidia0 ENOENT"
    check "mknod'ed GPU 0 denied by cgroup" mknod_denied "$out"
    check "env names GPU 1 only" has_line "$out" "NVD=$GPU1"
    ;;
  privileged-none)
    b=$(new_bundle c1 privileged "" "" "")
    out=$(run_with "$shim" "$b" priv0)
    check "no GPU 0" has_line "$out" "/dev/nvidia0 ENOENT"
    check "no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
    check "mknod'ed GPU 0 denied by cgroup" mknod_denied "$out"
    ;;
  privileged-passthrough-policy)
    printf '[allocation]\nprivileged = "passthrough"\n' >> "$work/runtime.toml"
    b=$(new_bundle c1 privileged "" "" "")
    cp "$b/config.json" "$work/before.json"
    out=$(run_with "$shim" "$b" pass0)
    check "spec untouched" cmp -s "$b/config.json" "$work/before.json"
    check "GPU 0 reachable (policy passthrough)" has_line "$out" "/dev/nvidia0 ENXIO"
    ;;
  seed-before-after)
    # The seed's node: privileged DeepStream containers, allocation only in the env.
    b=$(new_bundle c1 privileged "\"NVIDIA_VISIBLE_DEVICES=$GPU1\"" "" "")
    cp "$b/config.json" "$b/config.orig"
    out=$(run_with runc "$b" seed-runc)
    check "plain runc: GPU 0 reachable (the seed's bug)" has_line "$out" "/dev/nvidia0 ENXIO"
    check "plain runc: GPU 1 reachable" has_line "$out" "/dev/nvidia1 ENXIO"
    # The same pod admitted through gpufence-device-plugin: its Allocate answer adds the marker.
    gf_write_spec "$b" privileged "$probe_args" "\"NVIDIA_VISIBLE_DEVICES=$GPU1\"" "$(gf_marker_mount $GPU1)" "" "$node"
    rm -f "$b/rootfs/tmp/n0"
    out=$(run_with "$shim" "$b" seed-shim)
    check "gpufence-runtime: GPU 0 gone" has_line "$out" "/dev/nvidia0 ENOENT"
    check "gpufence-runtime: GPU 0 denied even via mknod" mknod_denied "$out"
    check "gpufence-runtime: GPU 1 reachable" has_line "$out" "/dev/nvidia1 ENXIO"
    ;;
  unknown-uuid)
    b=$(new_bundle c1 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=GPU-deadbeef-0000-0000-0000-000000000000"')
    cp "$b/config.json" "$work/before.json"
    ids+=(unk)
    "$shim" --root "$state" create --bundle "$b" unk </dev/null >/dev/null 2>"$work/err"
    rc=$?
    check "create refused" test "$rc" -ne 0
    check "config.json byte-for-byte unchanged" cmp -s "$b/config.json" "$work/before.json"
    check "one clear line naming the UUID" grep -q "refusing to create container unk: .*GPU-deadbeef-0000-0000-0000-000000000000.*no GPU with this UUID" "$work/err"
    check "exactly one line" test "$(wc -l <"$work/err")" -eq 1
    check "runc never ran" bash -c "! runc --root '$state' state unk >/dev/null 2>&1"
    check "refusal logged" grep -q "event=runtime.refused container=unk" "$work/runtime.log"
    ;;
  malformed-config)
    b=$(new_bundle c1 unprivileged "" "$(gf_marker_mount $GPU0)" "")
    head -c 200 "$b/config.json" > "$b/config.trunc" && mv "$b/config.trunc" "$b/config.json"
    cp "$b/config.json" "$work/before.json"
    "$shim" --root "$state" create --bundle "$b" bad </dev/null >/dev/null 2>"$work/err"
    check "create refused" test $? -ne 0
    check "unchanged" cmp -s "$b/config.json" "$work/before.json"
    check "names the file" grep -q "malformed $b/config.json" "$work/err"
    ;;
  broken-runtime-config)
    b=$(new_bundle c1 unprivileged "" "$(gf_marker_mount $GPU0)" "")
    cp "$b/config.json" "$work/before.json"
    echo '[allocation' > "$work/runtime.toml"
    "$shim" --root "$state" create --bundle "$b" badcfg </dev/null >/dev/null 2>"$work/err"
    check "create refused" test $? -ne 0
    check "names the config file" grep -q "$work/runtime.toml:" "$work/err"
    check "unchanged" cmp -s "$b/config.json" "$work/before.json"
    out=$("$shim" --root "$state" list 2>&1)
    check "non-create commands still reach runc" grep -q "^ID" <<<"$out"
    ;;
  nvml-failure)
    sed -i "s|nvml_library = .*|nvml_library = \"$work/missing/libnvidia-ml.so.1\"|" "$work/runtime.toml"
    # With the driver's procfs a UUID resolves without NVML...
    b0=$(new_bundle c0 unprivileged "" "$(gf_marker_mount $GPU1)" "" "" 1)
    out=$(run_with "$shim" "$b0" procfs)
    check "UUID resolved from the driver's procfs without NVML" has_line "$out" "/dev/nvidia1 ENXIO"
    check "logged as driver-procfs" grep -q "container=procfs .*gpus_from=driver-procfs" "$work/runtime.log"
    # ...an index needs NVML's numbering: refused when NVML cannot be loaded.
    b=$(new_bundle c1 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=0"')
    cp "$b/config.json" "$work/before.json"
    "$shim" --root "$state" create --bundle "$b" nonvml </dev/null >/dev/null 2>"$work/err"
    check "create refused" test $? -ne 0
    check "unchanged" cmp -s "$b/config.json" "$work/before.json"
    check "says NVML cannot be loaded" grep -q "GPUs were requested but: cannot load NVML library" "$work/err"
    # A container that asks for no GPU still starts without NVML.
    b2=$(new_bundle c2 unprivileged "" "" "")
    out=$(run_with "$shim" "$b2" nogpu)
    check "non-GPU container unaffected" has_line "$out" "/dev/nvidia0 ENOENT"
    ;;
  index-via-nvml)
    rm -rf "$node/proc"
    b=$(new_bundle c1 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"')
    out=$(run_with "$shim" "$b" idx1)
    check "index 1 resolved through NVML" has_line "$out" "/dev/nvidia1 ENXIO"
    check "env carries the UUID, not the index" has_line "$out" "NVD=$GPU1"
    check "logged as nvml" grep -q "container=idx1 .*gpus_from=nvml" "$work/runtime.log"
    ;;
  procfs-narrowed)
    # A directory tree standing in for /proc/driver/nvidia/gpus (no driver here), bind-mounted
    # into the container where the hook is told to look.
    for bus in 0000:01:00.0 0000:02:00.0; do
      mkdir -p "$node/fakeproc/gpus/$bus"; echo "Bus Location: $bus" > "$node/fakeproc/gpus/$bus/information"
    done
    printf '[driver]\nprocfs_gpus_dir = "/fakeproc/gpus"\n' >> "$work/runtime.toml"
    fake_mount='{"destination":"/fakeproc/gpus","type":"bind","source":"'$node/fakeproc/gpus'","options":["rbind","ro"]}'
    list_args='["/bin/sh","-c","ls /fakeproc/gpus; echo END"]'
    b=$(new_bundle c1 unprivileged "" "$(gf_marker_mount $GPU1),$fake_mount" "" "$list_args" 1)
    out=$(run_with "$shim" "$b" proc1)
    check "GPU 1's entry is listed" has_line "$out" "0000:02:00.0"
    check "GPU 0's entry is hidden" bash -c "! grep -q 0000:01:00.0 <<<'$out'"
    check "the host still sees both" test -d "$node/fakeproc/gpus/0000:01:00.0" -a -d "$node/fakeproc/gpus/0000:02:00.0"
    check "the hook is in the spec" grep -q '"createContainer":\[{"path":"'"$shim"'","args":\["gpufence-runtime","hook","driver-procfs","--dir","/fakeproc/gpus","--keep","0000:02:00.0"\],"env":\["PATH=/usr/sbin:/usr/bin:/sbin:/bin"\],"timeout":30' "$b/config.json"
    b2=$(new_bundle c2 privileged "" "$fake_mount" "" "$list_args")
    out=$(run_with "$shim" "$b2" proc0)
    check "a privileged container with no GPU lists none" test "$out" = "END"
    ;;
  cdi-applied|cdi-malformed|cdi-unknown|cdi-conflict|cdi-foreign|cdi-two-dirs|cdi-hook-env|cdi-ldcache-symlinks)
    command -v cc >/dev/null || skip "needs a C compiler (cc) to build stand-in driver libraries"
    drv=$work/driver
    mkdir -p "$drv/usr/lib/x86_64-linux-gnu" "$drv/usr/bin" "$drv/etc" "$work/cdi"
    for lib in libcuda:libcuda.so.1 libnvidia-ml:libnvidia-ml.so.1 libnvcuvid:libnvcuvid.so.1 libnvidia-encode:libnvidia-encode.so.1; do
      echo 'int gpufence_stand_in;' | cc -shared -x c - -Wl,-soname,${lib#*:} -o "$drv/usr/lib/x86_64-linux-gnu/${lib%%:*}.so.550.54.15"
    done
    ldconfig -r "$drv" -C /etc/ld.so.cache
    printf '#!/bin/sh\necho stand-in nvidia-smi\n' > "$drv/usr/bin/nvidia-smi"; chmod +x "$drv/usr/bin/nvidia-smi"
    GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1 "$build/bin/gpufence" cdi generate \
      --driver-root "$drv" --hook-path "$shim" --output "$work/cdi/nvidia.yaml" 2>"$work/gen.err"
    cdi_dirs="\"$work/cdi\""
    [ "$case_name" = cdi-two-dirs ] && cdi_dirs+=",\"$work/cdi-run\""
    printf '[cdi]\nspec_dirs = [%s]\n' "$cdi_dirs" >> "$work/runtime.toml"
    cdi_args='["/bin/sh","-c","gpufence-probe /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1 >/dev/null && echo LIBCUDA=yes; /usr/bin/nvidia-smi; echo NVD=$NVIDIA_VISIBLE_DEVICES"]'
    b=$(new_bundle c1 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' "$cdi_args")
    cp "$b/config.json" "$work/before.json"
    case $case_name in
      cdi-applied)
        out=$(run_with "$shim" "$b" cdi1)
        check "GPU 1 node" has_line "$out" "/dev/nvidia1 ENXIO"
        check "GPU 0 absent" has_line "$out" "/dev/nvidia0 ENOENT"
        check "control node from the spec" has_line "$out" "/dev/nvidiactl ENXIO"
        check "driver library mounted" has_line "$out" "LIBCUDA=yes"
        check "nvidia-smi mounted and runs" has_line "$out" "stand-in nvidia-smi"
        check "env names the UUID" has_line "$out" "NVD=$GPU1"
        check "ldcache hook wrote the container's linker config" grep -qx /usr/lib/x86_64-linux-gnu "$b/rootfs/etc/ld.so.conf.d/00-gpufence-cdi.conf"
        check "and its cache knows libcuda" grep -q "libcuda.so.1" "$b/rootfs/etc/ld.so.cache"
        check "CDI devices logged" grep -q "cdi=\"nvidia.com/gpu=1 ($work/cdi/nvidia.yaml)\"" "$work/runtime.log"
        ;;
      cdi-malformed)
        # An nvidia.com/gpu spec is read strictly: a wrong type refuses the create, naming the
        # file and the field (never an exception's text).
        echo '{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "x",
  "containerEdits": {"mounts": [{"hostPath": 5, "containerPath": "/x"}]}}]}' > "$work/cdi/zz-broken.json"
        "$shim" --root "$state" create --bundle "$b" cdibad </dev/null >/dev/null 2>"$work/err"
        check "create refused" test $? -ne 0
        check "names the file" grep -q "malformed CDI spec: $work/cdi/zz-broken.json" "$work/err"
        check "names the field" grep -q "devices\[0\].containerEdits.mounts\[0\].hostPath must be a string, not a number" "$work/err"
        check "no exception text" bash -c "! grep -q 'json.exception\|internal error' '$work/err'"
        check "config.json unchanged" cmp -s "$b/config.json" "$work/before.json"
        ;;
      cdi-foreign)
        # Other vendors' specs never block GPU containers: a valid one using a field gpufence does
        # not model (additionalGids), a malformed one, and one that is not even YAML.
        printf 'cdiVersion: 0.7.0\nkind: vendor.example/fpga\ncontainerEdits:\n  additionalGids: [44]\ndevices:\n- name: fpga0\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/fpga0}\n' > "$work/cdi/fpga.yaml"
        printf 'cdiVersion: 0.5.0\nkind: vendor.example/nic\ndevices: {name: 5}\nunknownField: 1\n' > "$work/cdi/nic.yaml"
        printf 'cdiVersion: 0.5.0\nkind: [unclosed\n' > "$work/cdi/aa-broken.yaml"
        out=$(run_with "$shim" "$b" cdifor)
        check "GPU 1 node" has_line "$out" "/dev/nvidia1 ENXIO"
        check "driver library mounted" has_line "$out" "LIBCUDA=yes"
        check "no foreign edits applied" bash -c "! grep -q additionalGids '$b/config.json'"
        ;;
      cdi-two-dirs)
        # As upstream's registry: a later spec directory overrides an earlier one for a device
        # both define (the GPU Operator's /var/run/cdi over /etc/cdi); no "defined twice".
        mkdir -p "$work/cdi-run"
        sed 's/NVIDIA_VISIBLE_DEVICES=void/GF_FROM=run/' "$work/cdi/nvidia.yaml" > "$work/cdi-run/operator.yaml"
        b=$(new_bundle c2 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' '["/bin/sh","-c","gpufence-probe /dev/nvidia1; echo FROM=$GF_FROM"]')
        out=$(run_with "$shim" "$b" cdirun)
        check "GPU 1 node" has_line "$out" "/dev/nvidia1 ENXIO"
        check "edits came from the later directory" has_line "$out" "FROM=run"
        check "logged with the later file" grep -q "cdi=\"nvidia.com/gpu=1 ($work/cdi-run/operator.yaml)\"" "$work/runtime.log"
        ;;
      cdi-ldcache-symlinks)
        # The image's /etc/ld.so.conf.d, /etc and /sbin/ldconfig are symlinks out of its root.
        # The update-ldcache hook runs as host root before pivot_root: every path it writes must
        # resolve inside the container's root, and the ldconfig it runs is the host's.
        host_dir=$work/host-side
        mkdir -p "$host_dir/conf.d" "$host_dir/etc"
        ldmark=$work/image-ldconfig-ran
        mkdir -p "$b/rootfs/etc" "$b/rootfs/sbin"
        ln -s "$host_dir/conf.d" "$b/rootfs/etc/ld.so.conf.d"
        printf '#!/bin/sh\necho ran > %s\n' "$ldmark" > "$b/rootfs/sbin/ldconfig"; chmod +x "$b/rootfs/sbin/ldconfig"
        out=$(run_with "$shim" "$b" ldsym1)
        check "the container ran" has_line "$out" "LIBCUDA=yes"
        check "nothing written through /etc/ld.so.conf.d -> host" test -z "$(ls -A "$host_dir/conf.d")"
        # Resolved inside the root the link dangles, so the hook writes nothing (a warning runc
        # does not show) and the container runs; case 3 below shows the hook does write.
        check "nor anywhere inside the root" test -z "$(find "$b/rootfs" -name 00-gpufence-cdi.conf)"
        check "the image's /sbin/ldconfig never ran" test ! -e "$ldmark"
        b2=$(new_bundle c2 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' "$cdi_args")
        ln -s "$host_dir/etc" "$b2/rootfs/etc"
        out=$(run_with "$shim" "$b2" ldsym2)
        check "/etc -> host: the container ran" has_line "$out" "LIBCUDA=yes"
        check "/etc -> host: nothing written on the host" test -z "$(ls -A "$host_dir/etc")"
        b3=$(new_bundle c3 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' "$cdi_args")
        mkdir -p "$b3/rootfs/etc"
        ln -s ../../../../../../../../.. "$b3/rootfs/etc/ld.so.conf.d"
        out=$(run_with "$shim" "$b3" ldsym3)
        check "/etc/ld.so.conf.d -> ../../..: nothing at the host's /" test ! -e /00-gpufence-cdi.conf
        check "it stays inside the root" test -s "$b3/rootfs/00-gpufence-cdi.conf"
        # ldconfig -r only chroots, and the root's procfs is mounted when the hook runs:
        # /proc/1/root is the host's "/". The image points ldconfig's aux cache there.
        mkdir -p "$host_dir/aux"
        b4=$(new_bundle c4 unprivileged "" "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' "$cdi_args")
        mkdir -p "$b4/rootfs/var/cache"
        ln -s "/proc/1/root$host_dir/aux" "$b4/rootfs/var/cache/ldconfig"
        out=$(run_with "$shim" "$b4" ldsym4)
        check "aux cache -> /proc/1/root/<host dir>: the container ran" has_line "$out" "LIBCUDA=yes"
        check "aux cache -> /proc/1/root/<host dir>: nothing written on the host" test -z "$(ls -A "$host_dir/aux")"
        check "and ldconfig still built the container's cache" grep -q "libcuda.so.1" "$b4/rootfs/etc/ld.so.cache"
        ;;
      cdi-hook-env)
        # A CDI hook without env must not run with the container's environment (an image's
        # LD_PRELOAD would run as host root): it gets PATH only, and a timeout.
        printf '#!/bin/sh\nenv > "%s"\n' "$work/hook-env.txt" > "$work/dump-env"; chmod +x "$work/dump-env"
        printf 'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: "1"\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/nvidia1}\n    hooks:\n    - {hookName: createContainer, path: %s}\n' "$work/dump-env" > "$work/cdi/nvidia.yaml"
        b=$(new_bundle c3 unprivileged '"LD_PRELOAD=/no-such-evil.so","GF_IMAGE_SECRET=1"' "" '"cdi.k8s.io/gpufence_x":"nvidia.com/gpu=1"' '["/bin/sh","-c","gpufence-probe /dev/nvidia1"]')
        out=$(run_with "$shim" "$b" cdihook)
        check "GPU 1 node" has_line "$out" "/dev/nvidia1 ENXIO"
        check "the hook ran" test -s "$work/hook-env.txt"
        check "without the image's LD_PRELOAD" bash -c "! grep -q LD_PRELOAD '$work/hook-env.txt'"
        check "without the image's env" bash -c "! grep -q GF_IMAGE_SECRET '$work/hook-env.txt'"
        check "with the minimal PATH" grep -qx "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "$work/hook-env.txt"
        check "and a timeout" grep -q '"timeout":30' "$b/config.json"
        ;;
      cdi-unknown)
        sed -i 's/^  - name: "1"$/  - name: "one"/' "$work/cdi/nvidia.yaml"
        "$shim" --root "$state" create --bundle "$b" cdiunk </dev/null >/dev/null 2>"$work/err"
        check "create refused" test $? -ne 0
        check "names the device and the spec" grep -q "unknown CDI device nvidia.com/gpu=1 (not in $work/cdi/nvidia.yaml)" "$work/err"
        check "config.json unchanged" cmp -s "$b/config.json" "$work/before.json"
        ;;
      cdi-conflict)
        cp "$work/cdi/nvidia.yaml" "$work/cdi/other.json"
        "$shim" --root "$state" create --bundle "$b" cdidup </dev/null >/dev/null 2>"$work/err"
        check "create refused" test $? -ne 0
        check "names both specs" grep -q "defined by both $work/cdi/nvidia.yaml and $work/cdi/other.json" "$work/err"
        check "config.json unchanged" cmp -s "$b/config.json" "$work/before.json"
        ;;
    esac
    ;;
  hook-ld-preload)
    # The image sets LD_PRELOAD=./evil.so and ships evil.so. runc runs a hook that has no `env`
    # with the container's environment, as host root, before pivot_root, cwd = the rootfs
    # (CVE-2025-23266's shape). gpufence's hooks carry their own env, so the library never loads.
    command -v cc >/dev/null || skip "needs a C compiler (cc) to build the preload library"
    b=$(new_bundle c1 unprivileged '"LD_PRELOAD=./evil.so"' "$(gf_marker_mount $GPU1)" "" "" 1)
    marker=$work/evil-ran
    printf '#include <stdio.h>\n__attribute__((constructor)) static void evil(void) { FILE *f = fopen("%s", "a"); if (f) { fputs("ran as host root\\n", f); fclose(f); } }\n' "$marker" \
      | cc -shared -fPIC -x c - -o "$b/rootfs/evil.so"
    out=$(run_with "$shim" "$b" preload)
    check "the container ran with its GPU" has_line "$out" "/dev/nvidia1 ENXIO"
    check "the driver-procfs hook was added" grep -q '"driver-procfs"' "$b/config.json"
    check "the preload library never ran in a hook" test ! -e "$marker"
    # Control: the same edited spec with the hook's env removed, run by plain runc. The library
    # does run, so this test sees the attack when it succeeds.
    sed -i 's/,"env":\["PATH=\/usr\/sbin:\/usr\/bin:\/sbin:\/bin"\]//' "$b/config.json"
    run_with runc "$b" preload-control >/dev/null
    check "control: without the hook's env the attack succeeds" test -e "$marker"
    ;;
  env-not-an-allocation)
    # NVIDIA_VISIBLE_DEVICES is the pod's own env: no GPU from it, with CAP_SYS_ADMIN or privileged.
    for mode in sysadmin privileged; do
      for val in "$GPU1" 1; do
        id="env-$mode-${val:0:3}"
        b=$(new_bundle "$id" "$mode" "\"NVIDIA_VISIBLE_DEVICES=$val\"" "" "")
        out=$(run_with "$shim" "$b" "$id")
        check "$mode, NVIDIA_VISIBLE_DEVICES=$val: no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
        check "$mode, NVIDIA_VISIBLE_DEVICES=$val: no GPU 0" has_line "$out" "/dev/nvidia0 ENOENT"
        check "$mode, NVIDIA_VISIBLE_DEVICES=$val: mknod'ed GPU denied" mknod_denied "$out"
        check "$mode, NVIDIA_VISIBLE_DEVICES=$val: env says void" has_line "$out" "NVD=void"
        rm -f "$b/rootfs/tmp/n0"
      done
    done
    check "ignored, and logged as such" grep -q "event=runtime.ignored container=env-sysadmin-GPU what=\"NVIDIA_VISIBLE_DEVICES=$GPU1" "$work/runtime.log"
    ;;
  forged-marker)
    # A pod's own volume: hostPath /dev/null mounted at the marker path, read-write and read-only.
    rw_marker='{"destination":"/var/run/nvidia-container-devices/'$GPU1'","type":"bind","source":"/dev/null","options":["rbind","rw"]}'
    b=$(new_bundle c1 unprivileged "" "$rw_marker" "")
    out=$(run_with "$shim" "$b" forged-rw)
    check "rw marker: the container runs" has_line "$out" "/dev/nvidiactl ENOENT"
    check "rw marker: no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
    b=$(new_bundle c2 unprivileged "" "$(gf_marker_mount $GPU1)" "")
    out=$(run_with "$shim" "$b" forged-ro)
    check "ro marker: no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
    check "ro marker: mknod'ed GPU denied" mknod_denied "$out"
    b=$(new_bundle c3 sysadmin "" "$(gf_marker_mount $GPU1)" "")
    out=$(run_with "$shim" "$b" forged-sa)
    check "with CAP_SYS_ADMIN too: no GPU 1" has_line "$out" "/dev/nvidia1 ENOENT"
    check "ignored, and logged" grep -q "event=runtime.ignored container=forged-ro" "$work/runtime.log"
    # A marker next to the kubelet's device spec for another GPU: the channels disagree (a pod
    # forging one, or a reboot that renumbered the GPUs under a replayed answer): refused, never
    # GPU 1 (docs/trust-model.md, "Renumbered GPUs"). The pod only refuses itself.
    b=$(new_bundle c4 unprivileged "" "$(gf_marker_mount $GPU1)" "" "" 0)
    out=$(run_with "$shim" "$b" forged-mix)
    check "a marker for GPU 1 beside the device spec for GPU 0: refused" \
      grep -q "refusing to create container forged-mix: .*a mount marker names $GPU1 but the device specs name" "$work/forged-mix.err"
    check "the forged marker's GPU 1 never opens" bash -c "! grep -q '/dev/nvidia1 ENXIO' <<<'$out'"
    ;;
  containerd-refusal)
    # containerd's runc shim argv. The refusal must land in --log the way runc writes errors,
    # because that file, not stderr, is where containerd reads the reason from.
    b=$(new_bundle c1 unprivileged "" "" "" "" 7)
    cp "$b/config.json" "$work/before.json"
    ids+=(ctrd1 ctrd2)
    "$shim" --root "$state" --log "$work/log.json" --log-format json create --bundle "$b" \
      --pid-file "$work/init.pid" ctrd1 </dev/null >/dev/null 2>"$work/err"
    check "create refused" test $? -ne 0
    check "log.json holds runc's JSON error line naming the cause" grep -qE '^\{"level":"error","msg":"gpufence-runtime: refusing to create container ctrd1: device spec /dev/nvidia7 \(195:7\) names no GPU of this node","time":"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z"\}$' "$work/log.json"
    check "stderr says it too" grep -q "refusing to create container ctrd1" "$work/err"
    check "config.json byte-for-byte unchanged" cmp -s "$b/config.json" "$work/before.json"
    check "runc never ran" bash -c "! runc --root '$state' state ctrd1 >/dev/null 2>&1"
    "$shim" --root "$state" --log "$work/log.txt" create --bundle "$b" ctrd2 </dev/null >/dev/null 2>&1
    check "text log format as logrus writes it" grep -q '^time="[0-9T:.-]*Z" level=error msg="gpufence-runtime: refusing to create container ctrd2: ' "$work/log.txt"
    ;;
  restore-edited)
    # runc restore creates a container from the bundle's config.json too: it is edited first.
    b=$(new_bundle c1 privileged "" "" "")
    ids+=(rst1)
    "$shim" --root "$state" restore --image-path "$work/no-checkpoint" --bundle "$b" rst1 \
      </dev/null >/dev/null 2>"$work/err"
    check "the GPU nodes were removed before runc saw the spec" bash -c "! grep -q '\"/dev/nvidia[01]\"' '$b/config.json'"
    check "the device rules became a whitelist" grep -q '"resources":{"devices":\[{"allow":false,"type":"a","access":"rwm"}' "$b/config.json"
    ;;
  wrong-json-type)
    b=$(new_bundle c1 unprivileged "" '{"destination":"/x","type":"bind","source":5}' "")
    cp "$b/config.json" "$work/before.json"
    "$shim" --root "$state" create --bundle "$b" wrongtype </dev/null >/dev/null 2>"$work/err"
    check "create refused" test $? -ne 0
    check "names the field" grep -q "malformed $b/config.json: mounts\[4\].source must be a string" "$work/err"
    check "no internal error" bash -c "! grep -q 'internal error\|json.exception' '$work/err'"
    check "unchanged" cmp -s "$b/config.json" "$work/before.json"
    ;;
  systemd-cgroup)
    # containerd passes --systemd-cgroup when SystemdCgroup = true. runc's systemd driver cannot
    # express "allow all, then deny", so the rules must be a whitelist. No systemd runs on this
    # machine: runc's own start fails after the edit; the emitted rules are what is checked here,
    # and the unit test SystemdDriver.* replays runc's conversion of them.
    echo "note: no systemd here; checking the rules gpufence-runtime emits, not a systemd unit"
    b=$(new_bundle c1 privileged "" "$(gf_marker_mount $GPU1)" "")
    ids+=(sd1)
    "$shim" --root "$state" --systemd-cgroup create --bundle "$b" sd1 </dev/null >/dev/null 2>"$work/err"
    check "whitelist: the rules start with deny-all" grep -q '"resources":{"devices":\[{"allow":false,"type":"a","access":"rwm"}' "$b/config.json"
    check "no wildcard-major rule grants r or w" bash -c "! grep -qE '\{\"allow\":true,\"type\":\"[abc]\",\"access\":\"[^\"]*[rw]' '$b/config.json'"
    check "GPU 1 has its own allow" grep -q '{"allow":true,"type":"c","major":195,"minor":1,"access":"rwm"}' "$b/config.json"
    check "no rule admits major 195 as a whole" bash -c "! grep -q '\"major\":195,\"access\"' '$b/config.json'"
    check "no rule admits GPU 0" bash -c "! grep -q '\"major\":195,\"minor\":0,' '$b/config.json'"
    ;;
  privileged-drm)
    # DRM nodes of unallocated GPUs, GPU minors the driver has not created yet, the cgroupfs.
    drm_args='["/bin/sh","-c","gpufence-probe /dev/dri/card0 /dev/dri/card1 /dev/dri/card2 /dev/nvidia0 /dev/nvidia1; mknod /tmp/d0 c 226 0 && gpufence-probe /tmp/d0; mknod /tmp/n5 c 195 5 && gpufence-probe /tmp/n5; echo a > /sys/fs/cgroup/devices/devices.allow 2>/dev/null && echo CGROUP=writable || echo CGROUP=refused"]'
    cg='{"destination":"/sys/fs/cgroup","type":"cgroup","source":"cgroup","options":["nosuid","noexec","nodev","relatime","rw"]}'
    b=$(new_bundle c1 privileged "" "$(gf_marker_mount $GPU1),$cg" "" "$drm_args")
    out=$(run_with "$shim" "$b" drm1)
    check "GPU 1 opens" has_line "$out" "/dev/nvidia1 ENXIO"
    check "GPU 1's DRM node kept" has_line "$out" "/dev/dri/card1 ENXIO"
    check "GPU 0's DRM node removed" has_line "$out" "/dev/dri/card0 ENOENT"
    check "another vendor's DRM node kept" has_line "$out" "/dev/dri/card2 ENXIO"
    check "GPU 0's DRM node denied via mknod" has_line "$out" "/tmp/d0 EPERM"
    check "a GPU minor the driver has not created yet is denied" has_line "$out" "/tmp/n5 EPERM"
    check "the cgroup filesystem is read-only" has_line "$out" "CGROUP=refused"
    ;;
  cgroupfs-volume)
    # A pod's hostPath volume of the cgroup filesystem (rbind, as containerd's CRI binds volumes,
    # read-only or not): on cgroup v1, euid 0 alone can move into the root devices cgroup.
    esc='["/bin/sh","-c","echo $$ > /host-cg/devices/cgroup.procs 2>/dev/null && echo MOVED; mknod /tmp/n0 c 195 0 && gpufence-probe /tmp/n0"]'
    for opts in '"rbind","rw"' '"rbind","ro"'; do
      vol='{"destination":"/host-cg","type":"bind","source":"/sys/fs/cgroup","options":['$opts']}'
      b=$(new_bundle "cg-${opts:9:2}" unprivileged "" "$vol" "" "$esc" 1)
      cp "$b/config.json" "$work/before.json"
      ids+=("cg-${opts:9:2}")
      "$shim" --root "$state" create --bundle "$b" "cg-${opts:9:2}" </dev/null >/dev/null 2>"$work/err"
      check "hostPath /sys/fs/cgroup ($opts): create refused" test $? -ne 0
      check "hostPath /sys/fs/cgroup ($opts): says why" grep -q "binds /sys/fs/cgroup, .*cgroup filesystem: a container could move itself out of its devices cgroup" "$work/err"
      check "hostPath /sys/fs/cgroup ($opts): config.json unchanged" cmp -s "$b/config.json" "$work/before.json"
    done
    # Control: the same container through plain runc does escape, so this test sees the attack.
    vol='{"destination":"/host-cg","type":"bind","source":"/sys/fs/cgroup","options":["rbind","rw"]}'
    b=$(new_bundle cg-ctl unprivileged "" "$vol" "" "$esc" 1)
    out=$(run_with runc "$b" cg-control)
    if grep -q "MOVED" <<<"$out"; then
      check "control: with plain runc the container leaves its devices cgroup and opens GPU 0" has_line "$out" "/tmp/n0 ENXIO"
    else
      echo "note: this machine's cgroup layout did not let the control container move (no v1 devices hierarchy at /sys/fs/cgroup/devices); the refusal above is still checked"
    fi
    ;;
  log-planted)
    # A pod with a writable hostPath over the runtime's log directory plants a link (or a FIFO, a
    # hard link, a directory) where root appends on every create, and a second pod's env puts a
    # shell line into that log. Nothing may be written outside, and every create still succeeds.
    outside=$work/outside; mkdir -p "$outside"; : > "$outside/ld.so.preload"
    logdir=$work/logs/gpufence; mkdir -p "$logdir"
    hostile='"NVIDIA_VISIBLE_DEVICES= /var/log/pwn.so $(touch /tmp/pwned) `id`"'
    attempt() {  # attempt NAME: a create through the shim with the log at $logdir/runtime.log
      printf '[log]\nfile = "%s"\n[devices]\nroot = "%s"\nnvml_library = "%s"\n' \
        "$logdir/runtime.log" "$node" "$build/lib/mock-nvml/default/libnvidia-ml.so.1" > "$work/runtime.toml"
      b=$(new_bundle "lp-$1" unprivileged "$hostile" "" "" "" 1)
      out=$(run_with "$shim" "$b" "lp-$1")
      check "$1: the create still succeeds" has_line "$out" "/dev/nvidia1 ENXIO"
      check "$1: nothing written outside" test ! -s "$outside/ld.so.preload"
      check "$1: one clear line on stderr" grep -q "runtime.log_file_unavailable" "$work/lp-$1.err"
    }
    # A clean first create: the log is made 0600, and the pod's bytes are escaped in it.
    printf '[log]\nfile = "%s"\n[devices]\nroot = "%s"\nnvml_library = "%s"\n' \
      "$logdir/runtime.log" "$node" "$build/lib/mock-nvml/default/libnvidia-ml.so.1" > "$work/runtime.toml"
    b=$(new_bundle lp-clean unprivileged "$hostile" "" "" "" 1)
    out=$(run_with "$shim" "$b" lp-clean)
    check "clean: create succeeds" has_line "$out" "/dev/nvidia1 ENXIO"
    check "clean: log made 0600" test "$(stat -c %a "$logdir/runtime.log")" = 600
    check "clean: the pod's \$( and backticks are escaped in the log" \
      bash -c "grep -q 'runtime.ignored' '$logdir/runtime.log' && ! grep -qE '[$\`]' '$logdir/runtime.log'"
    sed "s/^/    log: /" "$logdir/runtime.log"; rm -f "$logdir/runtime.log"
    ln -s "$outside/ld.so.preload" "$logdir/runtime.log"; attempt symlink; rm -f "$logdir/runtime.log"
    ln "$outside/ld.so.preload" "$logdir/runtime.log"; attempt hardlink; rm -f "$logdir/runtime.log"
    mkfifo "$logdir/runtime.log"; attempt fifo; rm -f "$logdir/runtime.log"
    mkdir "$logdir/runtime.log"; attempt directory; rmdir "$logdir/runtime.log"
    # Each directory component swapped for a link to a directory outside.
    mv "$logdir" "$work/logs/gpufence.real"; ln -s "$outside" "$logdir"
    attempt dir-link; rm "$logdir"; mv "$work/logs/gpufence.real" "$logdir"
    mv "$work/logs" "$work/logs.real"; ln -s "$outside" "$work/logs"; mkdir -p "$outside/gpufence"
    attempt parent-link; rm "$work/logs"; mv "$work/logs.real" "$work/logs"
    check "no log file appeared outside" test -z "$(find "$outside" -name runtime.log)"
    ;;
  cgroupfs-race)
    # The race of the path check: a pod that can write the parent of its hostPath source swaps it
    # between a directory and a link to /sys/fs/cgroup while the shim checks and runc mounts. The
    # cgroup-mounts hook judges what runc mounted: no container may ever start holding the host's
    # cgroup filesystem, and an honest container with the same kind of volume is never refused.
    tries=${GPUFENCE_RACE_TRIES:-500}
    [ -d /sys/fs/cgroup/devices ] || skip "no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices: the escape this race aims at needs one"
    race=$work/race; mkdir -p "$race/vol"
    esc='["/bin/sh","-c","if echo $$ > /data/devices/cgroup.procs 2>/dev/null; then echo MOVED; fi; ls /data/devices/devices.list >/dev/null 2>&1 && echo SEES-HOST-CGROUPFS; echo DONE"]'
    vol='{"destination":"/data","type":"bind","source":"'"$race/vol"'","options":["rbind","rw"]}'
    gf_cgroupfs_swapper "$race/vol" &
    swapper=$!
    started=0 hook=0 path=0 other=0 wins=0
    b=$work/race-b; mkdir -p "$b"; gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
    for i in $(seq 1 "$tries"); do
      gf_write_spec "$b" unprivileged "$esc" "" "$vol" "" "$node" ""
      out=$("$shim" --root "$state" run --bundle "$b" "race-$i" 2>"$work/race.err" </dev/null)
      runc --root "$state" delete --force "race-$i" >/dev/null 2>&1
      if grep -q "DONE" <<<"$out"; then
        started=$((started + 1))
        grep -qE "MOVED|SEES-HOST-CGROUPFS" <<<"$out" && wins=$((wins + 1))
      elif grep -q "the container's mounts hold" "$work/race.err"; then hook=$((hook + 1))
      elif grep -q "cgroup filesystem: a container could move" "$work/race.err"; then path=$((path + 1))
      else other=$((other + 1)); fi
    done
    check "the swapper raced to the end" kill -0 "$swapper"
    kill "$swapper" 2>/dev/null; wait "$swapper" 2>/dev/null
    echo "race: $tries tries: $started started, $wins with the host's cgroupfs, $path refused by the path check, $hook refused by the cgroup-mounts hook, $other failed otherwise"
    check "no container started holding the host's cgroup filesystem" test "$wins" -eq 0
    check "the race was hit: the hook refused what the path check had passed" test "$hook" -gt 0
    # Honest containers with a volume that nobody swaps: never refused.
    mkdir -p "$race/honest"
    hvol='{"destination":"/data","type":"bind","source":"'"$race/honest"'","options":["rbind","rw"]}'
    refused=0
    b=$work/honest-b; mkdir -p "$b"; gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
    for i in $(seq 1 50); do
      gf_write_spec "$b" unprivileged '["/bin/sh","-c","echo DONE"]' "" "$hvol" "" "$node" ""
      out=$("$shim" --root "$state" run --bundle "$b" "honest-$i" 2>"$work/honest.err" </dev/null)
      runc --root "$state" delete --force "honest-$i" >/dev/null 2>&1
      grep -q DONE <<<"$out" || { refused=$((refused + 1)); sed 's/^/    | /' "$work/honest.err"; }
    done
    check "50 honest containers with a bind volume all start" test "$refused" -eq 0
    ;;
  cgroupfs-propagation)
    # A cgroup filesystem that appears on the host below a volume's source after the create (the
    # kubelet mounts subPath volumes in an rshared directory; any host agent may mount): a bind
    # that receives host mounts (rslave, HostToContainer) is refused, and one without a
    # propagation option is made rprivate, so nothing mounted later reaches the container.
    hp=$work/hp; mkdir -p "$hp"; mount --bind "$hp" "$hp" && mount --make-shared "$hp" || skip "cannot make a shared mount here"
    # The host's mount comes once the container runs (it marks /vol/.up), not after a guessed
    # delay; a container that never runs (refused) is not waited for past the create.
    mount_when_up() {
      local _
      for _ in $(seq 600); do
        [ -e "$hp/.up" ] && { mkdir -p "$hp/cg"; mount --rbind /sys/fs/cgroup "$hp/cg"; return; }
        [ -e "$work/stop-mounter" ] && return
        sleep 0.05
      done
    }
    args='["/bin/sh","-c",": > /vol/.up 2>/dev/null; i=0; while [ ! -e /vol/cg/devices ] && [ $i -lt 25 ]; do sleep 0.2; i=$((i+1)); done; if echo $$ > /vol/cg/devices/cgroup.procs 2>/dev/null; then echo MOVED; fi; ls /vol/cg/devices >/dev/null 2>&1 && echo SEES-HOST-CGROUPFS; echo DONE"]'
    for opts in '"rbind","rslave","ro"' '"rbind","rw"'; do
      vol='{"destination":"/vol","type":"bind","source":"'"$hp"'","options":['"$opts"']}'
      name=prop-${opts:9:2}
      b=$(new_bundle "$name" unprivileged "" "$vol" "" "$args" 1)
      cp "$b/config.json" "$work/before.json"
      mount_when_up &
      mounter=$!
      out=$(run_with "$shim" "$b" "$name")
      : > "$work/stop-mounter"; wait "$mounter"; umount -R "$hp/cg" 2>/dev/null; rm -f "$work/stop-mounter" "$hp/.up"
      if [ "$opts" = '"rbind","rslave","ro"' ]; then
        check "rslave: create refused" bash -c "! grep -q DONE <<<'$out'"
        check "rslave: says why" grep -q "asks for rslave propagation" "$work/$name.err"
        check "rslave: config.json unchanged" cmp -s "$b/config.json" "$work/before.json"
      else
        check "no propagation option: the container runs" grep -q DONE <<<"$out"
        check "no propagation option: the host's later cgroupfs never reaches it" bash -c "! grep -qE 'MOVED|SEES-HOST-CGROUPFS' <<<'$out'"
        check "no propagation option: made rprivate" grep -q '"rprivate"' "$b/config.json"
      fi
    done
    # Control: plain runc with the same unpinned volume receives the host's mount.
    vol='{"destination":"/vol","type":"bind","source":"'"$hp"'","options":["rbind","rw"]}'
    b=$(new_bundle prop-ctl unprivileged "" "$vol" "" "$args" 1)
    mount_when_up &
    mounter=$!
    out=$(run_with runc "$b" prop-ctl)
    : > "$work/stop-mounter"; wait "$mounter"; umount -R "$hp/cg" 2>/dev/null; rm -f "$work/stop-mounter" "$hp/.up"
    check "control: through plain runc the later host mount does reach the container" grep -q SEES-HOST-CGROUPFS <<<"$out"
    umount "$hp"
    ;;
  passthrough-commands)
    check "--version is runc's" test "$("$shim" --version)" = "$(runc --version)"
    check "--help is runc's" bash -c "'$shim' --help | grep -q 'Open Container Initiative runtime'"
    printf '[runtime]\nlow_level = "%s"\n' "$shim" > "$work/runtime.toml"
    "$shim" state x >/dev/null 2>"$work/err"
    check "refuses to exec itself" grep -q "is gpufence-runtime itself" "$work/err"
    ;;
  argv-bundle-after-id)
    # runc 1.1 reads flags after the container id (urfave/cli's reorderArgs): `run ID --bundle B`
    # runs B. The shim must edit B, not the config.json of the directory it was started in.
    decoy=$(new_bundle decoy privileged "" "" "")
    b=$(new_bundle c1 privileged '"NVIDIA_VISIBLE_DEVICES=all"' "$(gf_marker_mount $GPU1)" "")
    cp "$decoy/config.json" "$work/decoy-before.json"
    ids+=(after1 after2)
    out=$(cd "$decoy" && "$shim" --root "$state" run after1 --bundle "$b" 2>"$work/after1.err")
    check "GPU 1 (the allocation) opens" has_line "$out" "/dev/nvidia1 ENXIO"
    check "GPU 0 is absent from the bundle runc ran" has_line "$out" "/dev/nvidia0 ENOENT"
    check "the working directory's config.json is untouched" cmp -s "$decoy/config.json" "$work/decoy-before.json"
    # Both forms of one flag: runc rejects the line; the shim refuses it, saying runc's reason.
    (cd "$decoy" && "$shim" --root "$state" --log "$work/log2.json" --log-format json run after2 \
      --bundle "$b" -b "$decoy") </dev/null >/dev/null 2>"$work/after2.err"
    check "--bundle with -b refused" grep -q "Cannot use two forms of the same flag: b bundle" "$work/after2.err"
    check "the refusal reaches the --log file" grep -q '"level":"error","msg":"gpufence-runtime: refusing the command line: runc 1.1 rejects the flags of .run.: Cannot use two forms' "$work/log2.json"
    check "runc never ran after2" bash -c "! runc --root '$state' state after2 >/dev/null 2>&1"
    ;;
  argv-matches-runc)
    # Random command lines, each given to the runc installed here and to the shim, from an
    # empty directory, with bundles that do not exist: runc names the bundle it chdir'd to (or
    # says it found no config.json in the working directory, or rejects the line, or prints
    # help); the shim names the config.json it could not open, or refuses the line, or passes
    # help on. Both must agree on every line.
    cwd=$work/cwd
    mkdir -p "$cwd"
    vocab=(--bundle --bundle --bundle -b -b --bundle=/v1 -b=/v2 /v3 /v3 /v4 -- -- - --no-pivot
      --no-pivot=false --pid-file /p --help=false -h --detach -d --bogus ---bundle -x rel id2)
    reading() {  # reading OUTPUT RC: bundle:<path> | refused | help
      local out=$1 rc=$2 p
      if p=$(grep -oE 'chdir .*: no such file or directory' <<<"$out" | head -1) && [ -n "$p" ]; then
        p=${p#chdir }; p=${p%: no such file or directory}
        [ "${p:0:1}" = / ] || p=$cwd/$p
        echo "bundle:$p"
      elif grep -q 'JSON specification file config.json not found' <<<"$out"; then
        echo "bundle:$cwd"
      elif p=$(grep -oE 'open .*/config\.json: No such file or directory' <<<"$out" | head -1) && [ -n "$p" ]; then
        p=${p#open }; echo "bundle:${p%/config.json: No such file or directory}"
      elif grep -qE 'Incorrect Usage|requires exactly|runc 1\.1 re(jects|quires)' <<<"$out"; then
        echo refused
      elif [ "$rc" = 0 ] && grep -q '^USAGE:' <<<"$out"; then
        echo help
      else
        echo "other(rc=$rc): $(head -c 300 <<<"$out" | tr '\n' ' ')"
      fi
    }
    RANDOM=16
    agree=0 n=0 kinds=()
    for i in $(seq 1 300); do
      cmd=create; [ $((RANDOM % 4)) = 0 ] && cmd=run
      # Random flags and values, and (mostly) one container id somewhere among them.
      tokens=()
      for j in $(seq 1 $((RANDOM % 6))); do tokens+=("${vocab[RANDOM % ${#vocab[@]}]}"); done
      at=$((RANDOM % (${#tokens[@]} + 1)))
      form=("$cmd" "${tokens[@]:0:at}")
      [ $((RANDOM % 8)) = 0 ] || form+=(id1)
      form+=("${tokens[@]:at}")
      r_out=$(cd "$cwd" && runc --root "$state/r" "${form[@]}" </dev/null 2>&1); r_rc=$?
      s_out=$(cd "$cwd" && "$shim" --root "$state/s" "${form[@]}" </dev/null 2>&1); s_rc=$?
      r=$(reading "$r_out" $r_rc); s=$(reading "$s_out" $s_rc)
      n=$((n + 1)); kinds+=("${r%%:*}")
      if [ "$r" = "$s" ]; then agree=$((agree + 1)); else
        echo "  differ: ${form[*]}"; echo "    runc:  $r"; echo "    shim:  $s"
      fi
    done
    echo "  $agree of $n command lines read alike; runc's readings: $(printf '%s\n' "${kinds[@]}" | sort | uniq -c | tr -s ' \n' ' ')"
    check "gpufence-runtime reads every line as runc $(runc --version | head -1 | cut -d' ' -f3) does" test "$agree" = "$n"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed; runtime log:"; sed 's/^/    | /' "$work/runtime.log" 2>/dev/null
  for f in "$work"/*.err; do [ -s "$f" ] && { echo "  $f:"; sed 's/^/    | /' "$f"; }; done
  exit 1
fi
