# Shared by `make demo` and the scenario tests: a simulated GPU node (fake /dev/nvidia* nodes,
# the mock NVML library) and OCI bundles shaped the way containerd's CRI writes them.
# Source it; it defines functions only.

# Capability names by number (linux/capability.h), to build a privileged spec from the host's
# own bounding set: a hard-coded "all capabilities" list fails where the host lacks one
# (this VM has no CAP_SYS_RESOURCE in its bounding set).
GF_CAP_NAMES=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
  LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE
  SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME
  SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG
  WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE)

# The host's bounding set as a JSON list of "CAP_..." strings.
gf_host_caps_json() {
  local hex mask i out=""
  hex=$(awk '/^CapBnd:/ {print $2}' /proc/self/status)
  mask=$((16#$hex))
  for i in "${!GF_CAP_NAMES[@]}"; do
    if (( (mask >> i) & 1 )); then out+="${out:+,}\"CAP_${GF_CAP_NAMES[$i]}\""; fi
  done
  printf '[%s]' "$out"
}

# Default capabilities of an unprivileged container (containerd's default set, no SYS_ADMIN).
GF_DEFAULT_CAPS='["CAP_CHOWN","CAP_DAC_OVERRIDE","CAP_FSETID","CAP_FOWNER","CAP_MKNOD","CAP_NET_RAW","CAP_SETGID","CAP_SETUID","CAP_SETFCAP","CAP_SETPCAP","CAP_NET_BIND_SERVICE","CAP_SYS_CHROOT","CAP_KILL","CAP_AUDIT_WRITE"]'

# The simulated node's GPUs have one description: the mock NVML's
# tools/mock-nvml/examples/two-rtx3080.json (GF_NODE_JSON names another). gf_node_gpus prints one
# line per GPU: "minor bus uuid name" (bus as the driver's procfs writes it, 0000:01:00.0).
gf_node_json() { echo "${GF_NODE_JSON:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tools/mock-nvml/examples/two-rtx3080.json}"; }
gf_node_gpus() {
  python3 -c 'import json, sys
for g in json.load(open(sys.argv[1]))["gpus"]:
    print(g["minor"], g["pci_bus_id"][4:].lower(), g["uuid"], g["name"])' "$(gf_node_json)"
}
# gf_gpu_uuids: the UUIDs, in minor order (GPU=($(gf_gpu_uuids))).
gf_gpu_uuids() { gf_node_gpus | sort -n | awk '{print $3}'; }

# gf_make_node_root DIR: a fake host with the GPUs of gf_node_gpus: /dev/nvidiaN, /dev/nvidiactl,
# the driver's /proc/driver/nvidia/gpus entries and one DRM card per GPU (plus another vendor's).
gf_make_node_root() {
  local root=$1 minor bus uuid name card=0
  mkdir -p "$root/dev/dri" "$root/proc"
  mknod -m 666 "$root/dev/nvidiactl" c 195 255
  # The host's registered majors, plus the NVIDIA driver's as a real GPU node has them.
  awk 'BEGIN{c=0} /^Character devices:/ {print; print "195 nvidia-frontend"; print "226 drm"; print "510 nvidia-caps"; print "511 nvidia-uvm"; next} {print}' /proc/devices \
    | awk '!seen[$0]++' > "$root/proc/devices"
  # gf_drm_card N PCI VENDOR: /dev/dri/cardN and its sysfs link to the PCI device.
  gf_drm_card() {
    mknod -m 666 "$root/dev/dri/card$1" c 226 "$1"
    mkdir -p "$root/sys/class/drm/card$1" "$root/sys/devices/pci0000:00/$2"
    echo "226:$1" > "$root/sys/class/drm/card$1/dev"
    echo "$3" > "$root/sys/devices/pci0000:00/$2/vendor"
    ln -s "../../../devices/pci0000:00/$2" "$root/sys/class/drm/card$1/device"
  }
  while read -r minor bus uuid name; do
    mknod -m 666 "$root/dev/nvidia$minor" c 195 "$minor"
    gf_drm_card "$card" "$bus" 0x10de
    card=$((card + 1))
    mkdir -p "$root/proc/driver/nvidia/gpus/$bus"
    printf 'Model: \t\t %s\nIRQ:   \t\t 13%s\nGPU UUID: \t %s\nVideo BIOS: \t 94.02.42.00.a9\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %s\nGPU Excluded:\t No\n' \
      "$name" "$minor" "$uuid" "$bus" "$minor" > "$root/proc/driver/nvidia/gpus/$bus/information"
  done < <(gf_node_gpus)
  # Another vendor's GPU: a DRM card no NVIDIA GPU owns, never touched by gpufence.
  gf_drm_card "$card" 0000:00:02.0 0x8086
}

# gf_make_rootfs DIR PROBE: a busybox-static root with the probe binary.
gf_make_rootfs() {
  local rootfs=$1 probe=$2 busybox
  busybox=$(command -v busybox || echo /bin/busybox)
  mkdir -p "$rootfs/bin" "$rootfs/tmp" "$rootfs/proc" "$rootfs/dev" "$rootfs/sys"
  cp "$busybox" "$rootfs/bin/busybox"
  for app in sh cat echo sleep mknod ls env true; do ln -sf busybox "$rootfs/bin/$app"; done
  cp "$probe" "$rootfs/bin/gpufence-probe"
}

# gf_kubelet_devices NODE_ROOT MINOR...: the linux.devices entries and device cgroup rules
# containerd's CRI writes for the kubelet's DeviceSpecs (/dev/nvidiaN, permissions "rw"), as
# two JSON fragments separated by a newline.
gf_kubelet_devices() {
  local root=$1 m devs="" rules=""
  shift
  for m in "$@"; do
    devs+="${devs:+,}{\"path\":\"/dev/nvidia$m\",\"type\":\"c\",\"major\":195,\"minor\":$m,\"fileMode\":438,\"uid\":0,\"gid\":0}"
    rules+=",{\"allow\":true,\"type\":\"c\",\"major\":195,\"minor\":$m,\"access\":\"rw\"}"
  done
  [ -e "$root/dev/nvidiactl" ] && [ $# -gt 0 ] && {
    devs+=",{\"path\":\"/dev/nvidiactl\",\"type\":\"c\",\"major\":195,\"minor\":255,\"fileMode\":438,\"uid\":0,\"gid\":0}"
    rules+=",{\"allow\":true,\"type\":\"c\",\"major\":195,\"minor\":255,\"access\":\"rw\"}"
  }
  printf '%s\n%s\n' "$devs" "$rules"
}

# gf_write_spec BUNDLE MODE ARGS_JSON ENV_ITEMS MOUNT_ITEMS ANNOTATION_ITEMS [NODE_ROOT] [MINORS]
#   MODE privileged: host bounding set, allow-all devices cgroup, every host GPU node listed
#        (what containerd's CRI does for a privileged container);
#   MODE unprivileged: default caps, default-deny devices cgroup.
#   MODE sysadmin: unprivileged, plus CAP_SYS_ADMIN (capabilities.add: [SYS_ADMIN]).
#   *_ITEMS are JSON fragments placed inside the respective list/object (may be empty).
#   MINORS: GPUs the kubelet gave as DeviceSpecs (space separated), for a non-privileged MODE.
gf_write_spec() {
  local bundle=$1 mode=$2 args=$3 env=$4 mounts=$5 annotations=$6 node_root=${7:-} minors=${8:-}
  local caps rules devices=""
  if [ "$mode" = privileged ]; then
    caps=$(gf_host_caps_json)
    rules='{"allow":true,"access":"rwm"}'
    local n
    for n in "$node_root"/dev/nvidia* "$node_root"/dev/dri/*; do
      [ -c "$n" ] || continue
      local name=${n#"$node_root"/dev/} maj min
      maj=$(stat -c '%t' "$n"); min=$(stat -c '%T' "$n")
      devices+="${devices:+,}{\"path\":\"/dev/$name\",\"type\":\"c\",\"major\":$((16#$maj)),\"minor\":$((16#$min)),\"fileMode\":438,\"uid\":0,\"gid\":0}"
    done
  else
    caps=$GF_DEFAULT_CAPS
    [ "$mode" = sysadmin ] && caps=${caps%]}',"CAP_SYS_ADMIN"]'
    rules='{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":3,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":5,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":8,"access":"rwm"},{"allow":true,"type":"c","major":1,"minor":9,"access":"rwm"},{"allow":true,"type":"c","major":5,"minor":0,"access":"rwm"},{"allow":true,"type":"c","major":5,"minor":2,"access":"rwm"},{"allow":true,"type":"c","major":136,"access":"rwm"}'
    if [ -n "$minors" ]; then
      local kd
      # shellcheck disable=SC2086
      kd=$(gf_kubelet_devices "$node_root" $minors)
      devices=$(sed -n 1p <<<"$kd")
      rules+=$(sed -n 2p <<<"$kd")
    fi
  fi
  local mount_list='{"destination":"/proc","type":"proc","source":"proc"},{"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid","strictatime","mode=755","size=65536k"]},{"destination":"/dev/pts","type":"devpts","source":"devpts","options":["nosuid","noexec","newinstance","ptmxmode=0666","mode=0620"]},{"destination":"/sys","type":"sysfs","source":"sysfs","options":["nosuid","noexec","nodev","ro"]}'
  [ -n "$mounts" ] && mount_list+=",$mounts"
  cat > "$bundle/config.json" <<JSON
{"ociVersion":"1.0.2-dev","process":{"terminal":false,"user":{"uid":0,"gid":0},"args":$args,"env":["PATH=/bin"${env:+,$env}],"cwd":"/","capabilities":{"bounding":$caps,"effective":$caps,"permitted":$caps},"noNewPrivileges":false},"root":{"path":"rootfs"},"hostname":"gpufence-test","mounts":[$mount_list],"annotations":{${annotations}},"linux":{"devices":[${devices}],"resources":{"devices":[$rules]},"namespaces":[{"type":"pid"},{"type":"ipc"},{"type":"uts"},{"type":"mount"}]}}
JSON
}

gf_marker_mount() {  # gf_marker_mount ID -> a kubelet volume-mounts marker
  printf '{"destination":"/var/run/nvidia-container-devices/%s","type":"bind","source":"/dev/null","options":["rbind","ro"]}' "$1"
}

# gf_write_runtime_config FILE NODE_ROOT LOG_FILE [NVML_LIBRARY]: a gpufence-runtime config for a
# simulated node (device nodes and driver procfs under NODE_ROOT).
gf_write_runtime_config() {
  {
    printf '[log]\nfile = "%s"\n[devices]\nroot = "%s"\n' "$3" "$2"
    if [ -n "${4:-}" ]; then printf 'nvml_library = "%s"\n' "$4"; fi
  } > "$1"
}

# gf_runc_preflight PROBE: can this machine run a container at all? Prints why not and returns 1.
# (A sandbox without namespaces or cgroups is an environment problem, not a gpufence failure.)
gf_runc_preflight() {
  local dir out
  dir=$(mktemp -d /tmp/gpufence-preflight-XXXXXX)
  mkdir -p "$dir/b"
  gf_make_rootfs "$dir/b/rootfs" "$1"
  gf_write_spec "$dir/b" unprivileged '["/bin/true"]' "" "" ""
  if ! out=$(runc --root "$dir/state" run --bundle "$dir/b" "preflight-$$" 2>&1 </dev/null); then
    echo "this machine cannot run a plain runc container: $out"
    runc --root "$dir/state" delete --force "preflight-$$" >/dev/null 2>&1
    rm -rf "$dir"
    return 1
  fi
  rm -rf "$dir"
}

# gf_cgroupfs_swapper DIR: the race a pod that can write DIR's parent runs against a volume whose
# source is DIR: swaps DIR, forever, between the directory and a link to /sys/fs/cgroup, each state
# held 0-4 ms. Each swap is one renameat2(RENAME_EXCHANGE), as a careful attacker would make it,
# so DIR is never missing (containerd would create a missing source, and the race would stop).
# It exits, saying why, if a swap fails: callers check it is still running before they kill it.
gf_cgroupfs_swapper() {
  exec python3 - "$1" <<'PY'  # exec: killing the background job kills the swapper
import ctypes, os, random, sys, time
path = sys.argv[1]; link = path + ".swap"
os.symlink("/sys/fs/cgroup", link)
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
while True:
    if libc.renameat2(AT_FDCWD, path.encode(), AT_FDCWD, link.encode(), RENAME_EXCHANGE) != 0:
        sys.exit("cgroupfs swapper: renameat2 " + path + ": " + os.strerror(ctypes.get_errno()))
    time.sleep(random.uniform(0, 0.004))
PY
}
