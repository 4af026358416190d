# shellcheck shell=bash disable=SC2154  # src, build, line come from the script sourcing this
# Sourced by tests/scenario/cri_seed.sh, bench/cri_latency.sh and scripts/demo_cri.sh: a private
# containerd of line $line (a row of scripts/lib/containerd-lines.tsv: the system's, a Debian
# suite's or one built from the Go module proxy by scripts/fetch-containerd.sh), set up
# as a user would (containerd config default, gpufence setup containerd with handler "gpufence",
# then only the edits that keep this instance private and let it run in this VM), serving a
# simulated two-GPU node, with the test images imported; and run_pods. Needs $src, $build, $line;
# exits 77 (skip, saying why) when this machine cannot do it. See docs/containerd-lines.md.
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
. "$src/scripts/lib/bundle.sh"
. "$src/scripts/lib/images.sh"
# Which containerd: the line's row in the table (what each line's NRI enforces: docs/nri.md).
gf_line_field "$line" source >/dev/null || { echo "unknown containerd line '$line' (the lines: $(gf_lines | tr '\n' ' '))"; exit 2; }
bin=$(gf_line_bin "$line") || skip "$bin"
[ "$(id -u)" = 0 ] || skip "needs root to run containerd and mknod"
command -v runc >/dev/null || skip "runc is not installed"
for b in gpufence gpufence-runtime gpufence-device-plugin gpufence-test-cri gpufence-pause gpufence-probe gpufence-smi; do
  [ -x "$build/bin/$b" ] || skip "$build/bin/$b is not built"
done
why=$(gf_runc_preflight "$build/bin/gpufence-probe") || skip "$why"

work=$(gf_work_dir "${GF_CRI_WORK_PREFIX:-gpufence-cri}")
sock=$work/containerd.sock
cgroup=gpufence-cri-${work##*-}  # the pods' cgroup parent
ctr=("$bin/ctr" --address "$sock")
cd_pid="" plugin_pid="" kubelet_pid=""
cleanup() {
  local c
  [ -n "$kubelet_pid" ] && kill "$kubelet_pid" 2>/dev/null && wait "$kubelet_pid" 2>/dev/null
  [ -n "$plugin_pid" ] && kill "$plugin_pid" 2>/dev/null && wait "$plugin_pid" 2>/dev/null
  if [ -n "$cd_pid" ]; then
    # Whatever a failed run left: its tasks and containers, so no shim outlives the test.
    for c in $("${ctr[@]}" -n k8s.io containers ls -q 2>/dev/null); do
      "${ctr[@]}" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1
      "${ctr[@]}" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1
      "${ctr[@]}" -n k8s.io containers rm "$c" >/dev/null 2>&1
    done
    kill "$cd_pid" 2>/dev/null && wait "$cd_pid" 2>/dev/null
  fi
  # When containerd was gone first (a signal to the whole process group): the containers in this
  # instance's runc root, then its shims (each names this instance's socket).
  for c in $(runc --root "$work/runc/k8s.io" list -q 2>/dev/null); do
    runc --root "$work/runc/k8s.io" delete --force "$c" >/dev/null 2>&1
  done
  pkill -KILL -f -- "-address $sock" 2>/dev/null
  awk -v w="$work" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
  for c in "/sys/fs/cgroup/$cgroup" /sys/fs/cgroup/*/"$cgroup"; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

# The simulated node: two GPUs (fake nodes + driver procfs under a node root, the mock NVML).
node=$work/node
gf_make_node_root "$node"
# The driver's GPU list as containers see it: runc mounts nothing under /proc, so pods that look
# (cri_seed.sh's apps) get this copy as a volume at /fakeproc/gpus, and gpufence-runtime's
# driver-procfs hook narrows that path as it narrows /proc/driver/nvidia/gpus on a real node.
mkdir -p "$node/fakeproc"
cp -a "$node/proc/driver/nvidia/gpus" "$node/fakeproc/gpus"
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" \
  "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
printf '[driver]\nprocfs_gpus_dir = "/fakeproc/gpus"\n' >> "$work/runtime.toml"
# gpufence-nri's status (connected; what containerd created without it) in this run's directory.
printf '[nri]\nstatus_file = "%s"\nkeeper_dir = "%s"\n' "$work/nri-status.json" "$work/keeper" >> "$work/runtime.toml"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
# A copy the scenario may edit (cri_kubelet.sh renumbers the GPUs for a simulated reboot).
cp "$src/tools/mock-nvml/examples/two-rtx3080.json" "$work/nvml.json"
export MOCK_NVML_CONFIG=$work/nvml.json
export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
mapfile -t GPU < <(gf_gpu_uuids)  # the node's GPUs (scripts/lib/bundle.sh)

# containerd's config as a user makes it: the default, then gpufence setup, then only the edits
# that keep this instance private (paths, socket, NRI) and let it run in this VM.
cfg=$work/config.toml
"$bin/containerd" config default > "$cfg"
handler_binary=${GF_CRI_HANDLER_BINARY:-$build/bin/gpufence-runtime}
# GF_CRI_BEFORE_SETUP: a function that edits the user's config before gpufence setup runs.
[ -n "${GF_CRI_BEFORE_SETUP:-}" ] && "$GF_CRI_BEFORE_SETUP" "$cfg"
"$build/bin/gpufence" setup containerd --config "$cfg" --runtime-name gpufence \
  --binary "$handler_binary" > "$work/setup.log" 2>&1 || { cat "$work/setup.log"; echo "gpufence setup containerd failed"; exit 1; }
sed -i -E \
  -e "s|^root = .*|root = \"$work/root\"|" \
  -e "s|^state = .*|state = \"$work/state\"|" \
  -e "s|address = [\"']/run/containerd/containerd.sock[\"']|address = \"$sock\"|" \
  -e "s|restrict_oom_score_adj = false|restrict_oom_score_adj = true|" \
  -e "s|sandbox_image = .*|sandbox_image = \"$GF_PAUSE_IMAGE\"|" \
  -e "s|^( *)sandbox = .*|\1sandbox = \"$GF_PAUSE_IMAGE\"|" \
  -e "s|socket_path = [\"']/var/run/nri/nri.sock[\"']|socket_path = \"$work/nri/nri.sock\"|" \
  -e "s|plugin_path = [\"']/opt/nri/plugins[\"']|plugin_path = \"$work/nri/plugins\"|" \
  -e "s|plugin_config_path = [\"']/etc/nri/conf.d[\"']|plugin_config_path = \"$work/nri/conf.d\"|" \
  "$cfg"
# runc's state of this instance's containers in its own root (the shim's Root option; default
# /run/containerd/runc/<namespace>), so the doctor sees this node's containers only.
sed -i -E "s|^( *)Root = [\"'][\"']|\1Root = \"$work/runc\"|" "$cfg" "$work"/conf.d/*.toml 2>/dev/null
runc_root=$work/runc/k8s.io
if [ -n "${GF_CRI_CDI_SPEC:-}" ]; then
  # GF_CRI_CDI_SPEC=1: a spec from gpufence cdi generate, in a private dir both containerd and
  # gpufence-runtime read.
  mkdir -p "$work/cdi" "$node/usr/lib/x86_64-linux-gnu" "$node/etc"
  for lib in libcuda:libcuda.so.1 libnvidia-ml:libnvidia-ml.so.1; do  # stand-in driver libraries
    echo 'int gpufence_stand_in;' | cc -shared -x c - -Wl,-soname,${lib#*:} -o "$node/usr/lib/x86_64-linux-gnu/${lib%%:*}.so.550.54.15"
  done
  ldconfig -r "$node" -C /etc/ld.so.cache
  "$build/bin/gpufence" cdi generate --driver-root "$node" --output "$work/cdi/nvidia.json" \
    --hook-path "$build/bin/gpufence-runtime" 2>/dev/null || exit 1
  # This node's device nodes live under the node root: the spec's hostPath says so.
  python3 - "$work/cdi/nvidia.json" "$node" <<'PY'
import json, sys
path, root = sys.argv[1], sys.argv[2]
spec = json.load(open(path))
edits = [d["containerEdits"] for d in spec.get("devices", [])] + [spec.get("containerEdits", {})]
for e in edits:
    for n in e.get("deviceNodes", []):
        n["hostPath"] = root + n.get("hostPath", n["path"])
json.dump(spec, open(path, "w"))
PY
fi
# The device plugin writes its own spec at start (--cdi-spec-dir, docs/deviceplugin.md) into a
# private dynamic dir; containerd (1.7/2.x with CDI on) and gpufence-runtime read it after the
# user's dir, as they read /var/run/cdi after /etc/cdi.
plugin_cdi=$work/plugin-cdi
mkdir -p "$work/cdi" "$plugin_cdi"
# A spec's device hostPath ($node/dev/nvidiaN, from --dev-root) is a host path: containerd reads it
# in the real root, gpufence-runtime under its host root $node. A link $node$node -> $node makes
# the one path name the same node in both views, as on a real node where both roots are "/".
mkdir -p "$node$(dirname "$node")"
ln -sfn "$(realpath --relative-to="$node$(dirname "$node")" "$node")" "$node$node"
sed -i -E "s|cdi_spec_dirs = .*|cdi_spec_dirs = [\"$work/cdi\", \"$plugin_cdi\"]|" "$cfg"
printf '[cdi]\nspec_dirs = ["%s", "%s"]\n' "$work/cdi" "$plugin_cdi" >> "$work/runtime.toml"
if [ -n "${GF_CRI_ENABLE_CDI:-}" ]; then
  sed -i -E "s|enable_cdi = .*|enable_cdi = $GF_CRI_ENABLE_CDI|" "$cfg"
  grep -q "enable_cdi = $GF_CRI_ENABLE_CDI" "$cfg" || { echo "containerd $line has no enable_cdi"; exit 2; }
fi

# NRI (docs/nri.md): GF_CRI_NRI=1 turns it on where it is off by default (1.7: disable = true).
if [ -n "${GF_CRI_NRI:-}" ]; then
  sed -i -E '/io\.containerd\.nri\.v1\.nri/,/disable_connections/ s/^( *)disable = true/\1disable = false/' "$cfg"
  grep -A1 'io.containerd.nri.v1.nri' "$cfg" | grep -q 'disable = false' || { echo "containerd $line: cannot enable NRI"; exit 2; }
fi
# A sourcing script's own last edits of the config (gf_cri_edit_config CFG), if it defines them.
if declare -F gf_cri_edit_config >/dev/null; then gf_cri_edit_config "$cfg" || exit 2; fi

# containerd runs in a private mount namespace whose /dev holds the simulated GPUs' nodes
# (195:0, 195:1, 195:255 as on a GPU node), so what it lists for a privileged container
# (WithHostDevices: every device under its /dev) includes both GPUs, as on a real node: a check
# that a privileged pod has no node for the other GPU is then a real one (it fails through plain
# runc, cri_seed_runc.sh). Everything else of /dev is the host's (bound or copied: private_dev.sh);
# /var/lib and /run there are this run's scratch (a launched gpufence-nri logs to
# /var/lib/gpufence before its config arrives; containerd 1.x keeps its shims' sockets in
# /run/containerd/s whatever its state dir). The mounts end with the namespace. The shims and runc,
# started by containerd, share it.
# start_containerd: (again) with this config; its pid in cd_pid.
start_containerd() {
  mkdir -p "$work/var-lib"
  PATH=$bin:$PATH unshare --mount --propagation private sh -c '
    sh "$1" "$2" && mount --bind "$3" /var/lib && mount -t tmpfs -o mode=755 gpufence-test-run /run &&
      shift 3 && exec "$@"' sh "$src/scripts/lib/private_dev.sh" "$work/devfs" "$work/var-lib" \
    "$bin/containerd" --config "$cfg" >> "$work/containerd.log" 2>&1 &
  cd_pid=$!
  for _ in $(seq 150); do "${ctr[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
  "${ctr[@]}" version >/dev/null 2>&1
}
# restart_containerd: after an edit of $cfg, as an operator restarts it (containers keep running
# under their shims; this test has none running between its runs).
restart_containerd() {
  kill "$cd_pid" 2>/dev/null && wait "$cd_pid" 2>/dev/null
  start_containerd
}
start_containerd || skip "containerd $line does not start here: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"
echo "containerd $("$bin/containerd" --version | awk '{print $3, $4}'), $("$bin/containerd-shim-runc-v2" -v 2>/dev/null | awk '/Version/ {print "shim " $2; exit}'), $(runc --version | head -1)"

imgs=$work/images
gf_test_images "$imgs" "$build/bin/gpufence-pause" "$build/bin/gpufence-probe"
gf_seed_app_image "$imgs" "$build/bin/gpufence-smi" "$src/tools/deepstream-stand-in/deepstream-app"
gf_import_images "$bin/ctr" "$sock" "$imgs" > "$work/import.log" 2>&1 || { cat "$work/import.log"; echo "ctr images import failed"; exit 1; }

# The device plugin with its default strategies (cdi-annotations included) on every line:
# containerd 2.x (CDI on by default) and 1.7 with enable_cdi resolve the annotation from the
# plugin's own spec (docs/containerd-lines.md); its hook is this build's gpufence-runtime, and the
# driver files (GF_CRI_CDI_SPEC=1) sit under the node root, named $node/... by --driver-root.
plugin_args=(--cdi-spec-dir "$plugin_cdi" --cdi-hook-path "$build/bin/gpufence-runtime" --driver-root "$node")
# To reproduce other combinations by hand (docs/containerd-lines.md), not used by CTest:
# GF_CRI_PLUGIN_ARGS replaces the plugin's arguments; GF_CRI_ENABLE_CDI=true|false sets enable_cdi.
# (the private spec dir stays unless they name --cdi-spec-dir, so no run writes /var/run/cdi).
if [ -n "${GF_CRI_PLUGIN_ARGS+x}" ]; then
  read -r -a extra_args <<<"$GF_CRI_PLUGIN_ARGS"
  if [[ " ${extra_args[*]} " == *" --cdi-spec-dir "* ]]; then  # e.g. "--cdi-spec-dir off"
    plugin_args=("${plugin_args[@]:2:4}" "${extra_args[@]}")
  else
    plugin_args=("${plugin_args[@]:0:6}" "${extra_args[@]}")
  fi
fi

# run_pods NAME HANDLER PODS [gpufence-test-cri option...]: the plugin registers, the pods run,
# each looks at both GPUs; output in $work/NAME.out, exit status in $work/NAME.rc, gpufence-runtime's
# decisions meanwhile in $work/NAME.decisions. Optional, set for one call: RUN_IMAGE (default the
# app image), RUN_EXEC (the shell command ExecSync runs; default $probe), RUN_WHILE (a function
# called with NAME while every pod still runs, after the execs), RUN_PLUGIN_ARGS (more device
# plugin arguments).
probe='for m in 0 1; do gpufence-probe /dev/nvidia$m; if mknod /tmp/n$m c 195 $m 2>/dev/null; then gpufence-probe /tmp/n$m; else echo /tmp/n$m MKNOD_EPERM; fi; done; echo CVD=$CUDA_VISIBLE_DEVICES'
run_pods() {
  local name=$1 handler=$2 pods=$3 dp=$work/dp-$1
  shift 3
  mkdir -p "$dp"
  local seen; seen=$(cat "$work/runtime.log" 2>/dev/null | wc -l)
  # The kubelet first, the plugin once kubelet.sock is there, as on a node: the kubelet deletes
  # every socket in the directory when it starts, so a plugin started earlier would be cut off.
  local hold=()
  [ -n "${RUN_WHILE:-}" ] && hold=(--hold "$work/$name.release")
  "$build/bin/gpufence-test-cri" --plugin-dir "$dp" --runtime-endpoint "$sock" --handler "$handler" \
    --image "${RUN_IMAGE:-$GF_APP_IMAGE}" --pods "$pods" --name-prefix "$name" --cgroup-parent "/$cgroup" \
    --pod-resources "$work/pod-resources-$name.sock" "${hold[@]}" "$@" -- /bin/sh -c "${RUN_EXEC:-$probe}" \
    > "$work/$name.out" 2>&1 &
  kubelet_pid=$!
  for _ in $(seq 100); do [ -S "$dp/kubelet.sock" ] && break; sleep 0.05; done
  "$build/bin/gpufence-device-plugin" --plugin-dir "$dp" --host-root "$node" --dev-root "$node" \
    --log-file "$work/device-plugin-$name.log" "${plugin_args[@]}" ${RUN_PLUGIN_ARGS:-} &
  plugin_pid=$!
  if [ -n "${RUN_WHILE:-}" ]; then
    for _ in $(seq 600); do
      grep -q '^pods held until' "$work/$name.out" 2>/dev/null && break
      kill -0 "$kubelet_pid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q '^pods held until' "$work/$name.out" 2>/dev/null && "$RUN_WHILE" "$name"
    touch "$work/$name.release"
  fi
  end_pods "$name" "$seen"
}
# end_pods NAME SEEN: once the stand-in kubelet is done, its exit status in $work/NAME.rc, the
# plugin stopped, gpufence-runtime's decisions after log line SEEN in $work/NAME.decisions.
end_pods() {
  wait "$kubelet_pid"
  echo $? > "$work/$1.rc"
  kubelet_pid=""
  kill "$plugin_pid" 2>/dev/null && wait "$plugin_pid" 2>/dev/null
  plugin_pid=""
  tail -n +$(($2 + 1)) "$work/runtime.log" 2>/dev/null > "$work/$1.decisions"
  [ -n "${GF_CRI_QUIET:-}" ] || sed "s/^/  [$1] /" "$work/$1.out"
}
