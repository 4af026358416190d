#!/usr/bin/env bash
# A container's lifecycle the way containerd's runc shim drives a runtime binary:
#   --root R --log L --log-format json create --bundle B --pid-file P ID; start ID; wait; delete ID
# each step through the runtime under test, plain runc and gpufence-runtime interleaved run by run
# (machine noise hits both alike), bundle on tmpfs as containerd's are (/run/containerd/...).
# The container runs /bin/true. Spec: SPEC=unprivileged (kubelet device spec + marker for GPU 1,
# the plugin's default answer) or SPEC=privileged (privileged, marker for GPU 1). The baseline
# runs the spec gpufence-runtime produces, so both sides start the same container.
# Usage: bench/lifecycle.sh [RUNS] [unprivileged|privileged]   (needs root and runc)
#   BEFORE=/path/to/an/older/gpufence-runtime adds it as a third side (before/after figures).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
. "$here/scripts/lib/bundle.sh"
runs=${1:-30}
mode=${2:-unprivileged}
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
shim=$build/bin/gpufence-runtime

work=$(mktemp -d /tmp/gpufence-life-XXXXXX)
trap 'for i in $(runc --root "$work/state" list -q 2>/dev/null); do runc --root "$work/state" delete --force "$i"; done; umount "$work" 2>/dev/null; rm -rf "$work"' EXIT
mount -t tmpfs -o size=256m gpufence-bench "$work"
node=$work/node
gf_make_node_root "$node"
export MOCK_NVML_CONFIG=$here/tools/mock-nvml/examples/two-rtx3080.json
gf_write_runtime_config "$work/runtime.toml" "$node" "$work/runtime.log" "$build/lib/mock-nvml/default/libnvidia-ml.so.1"
export GPUFENCE_RUNTIME_CONFIG=$work/runtime.toml
b=$work/bundle
mkdir -p "$b"
gf_make_rootfs "$b/rootfs" "$build/bin/gpufence-probe"
marker=$(gf_marker_mount GPU-c3e79d42-1b5f-4a08-b6d2-7e9f05a1c3b2)
if [ "$mode" = privileged ]; then
  gf_write_spec "$b" privileged '["/bin/true"]' "" "$marker" "" "$node"
else
  gf_write_spec "$b" unprivileged '["/bin/true"]' "" "$marker" "" "$node" 1
fi
cp "$b/config.json" "$work/pristine.json"
sed 's|^\[log\]|[runtime]\nlow_level = "/bin/true"\n[log]|' "$work/runtime.toml" > "$work/edit-only.toml"
GPUFENCE_RUNTIME_CONFIG=$work/edit-only.toml "$shim" create --bundle "$b" edit-only
cp "$b/config.json" "$work/edited.json"
cmp -s "$work/edited.json" "$work/pristine.json" && { echo "the shim did not edit the spec" >&2; exit 1; }
# The same edited spec without the cgroup-mounts hook (one more exec at create, for every
# unprivileged spec with a bind mount): plain runc on it is a fourth side, so the hook's own cost
# reads as the difference between the two plain-runc sides.
python3 - "$work/edited.json" "$work/edited-nohook.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
hooks = spec.get("hooks", {}).get("createContainer", [])
spec.setdefault("hooks", {})["createContainer"] = [h for h in hooks if "cgroup-mounts" not in h.get("args", [])]
json.dump(spec, open(sys.argv[2], "w"))
PY

now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
# lifecycle RUNTIME ID: prints "create start wait delete" in microseconds.
lifecycle() {
  local rt=$1 id=$2 t0 t1 t2 t3 t4 pid
  case $rt in
    runc) cp "$work/edited.json" "$b/config.json" ;;
    runc-nohook) rt=runc; cp "$work/edited-nohook.json" "$b/config.json" ;;
    *) cp "$work/pristine.json" "$b/config.json" ;;
  esac
  t0=$(now_us)
  "$rt" --root "$work/state" --log "$b/log.json" --log-format json create --bundle "$b" \
    --pid-file "$b/init.pid" "$id" </dev/null >/dev/null
  t1=$(now_us)
  "$rt" --root "$work/state" --log "$b/log.json" --log-format json start "$id"
  t2=$(now_us)
  pid=$(cat "$b/init.pid")
  local st=R
  while [ "$st" != Z ] && read -r _ _ st _ 2>/dev/null < "/proc/$pid/stat"; do :; done  # exited
  t3=$(now_us)
  "$rt" --root "$work/state" --log "$b/log.json" --log-format json delete "$id"
  t4=$(now_us)
  echo "$((t1 - t0)) $((t2 - t1)) $((t3 - t2)) $((t4 - t3))"
}

before=${BEFORE:-}
lifecycle runc warm-a >/dev/null; lifecycle "$shim" warm-b >/dev/null
[ -n "$before" ] && lifecycle "$before" warm-c >/dev/null
: > "$work/runc.txt"; : > "$work/shim.txt"; : > "$work/before.txt"; : > "$work/nohook.txt"
for i in $(seq "$runs"); do
  lifecycle runc "r$i" >> "$work/runc.txt"
  lifecycle runc-nohook "n$i" >> "$work/nohook.txt"
  lifecycle "$shim" "s$i" >> "$work/shim.txt"
  [ -n "$before" ] && lifecycle "$before" "b$i" >> "$work/before.txt"
done
grep -q "granted=GPU-c3e79d42" "$work/runtime.log" || { echo "shim did not grant the GPU: benchmark invalid" >&2; exit 1; }
med() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
col() { awk -v c="$2" '{print $c}' "$1" | med; }
tot() { awk '{print $1+$2+$3+$4}' "$1" | med; }
ms() { awk -v v="$1" 'BEGIN{printf "%6.2f ms", v/1000}'; }
echo "spec: $mode; runs per side: $runs (interleaved); bundle on tmpfs; medians"
printf '%-22s %-10s %-10s %-10s %-10s %-10s\n' "" create start wait delete lifecycle
sides="runc nohook shim"; [ -n "$before" ] && sides+=" before"
for side in $sides; do
  f=$work/$side.txt
  case $side in
    runc) name="plain runc" ;; nohook) name="runc, no mount hook" ;; shim) name="gpufence-runtime" ;;
    *) name="gpufence-runtime (before)" ;;
  esac
  printf '%-22s %s %s %s %s %s\n' "$name" "$(ms "$(col "$f" 1)")" "$(ms "$(col "$f" 2)")" \
    "$(ms "$(col "$f" 3)")" "$(ms "$(col "$f" 4)")" "$(ms "$(tot "$f")")"
done
paste -d' ' "$work/shim.txt" "$work/runc.txt" | awk '{print ($1+$2+$3+$4)-($5+$6+$7+$8)}' | med > "$work/added"
echo "added per lifecycle (median of pairwise differences): $(ms "$(cat "$work/added")")"
paste -d' ' "$work/runc.txt" "$work/nohook.txt" | awk '{print $1-$5}' | med > "$work/hook"
echo "the cgroup-mounts hook, at create (median of pairwise differences): $(ms "$(cat "$work/hook")")"
if [ -n "$before" ]; then
  paste -d' ' "$work/before.txt" "$work/runc.txt" | awk '{print ($1+$2+$3+$4)-($5+$6+$7+$8)}' | med > "$work/added-before"
  echo "added per lifecycle by the 'before' binary:            $(ms "$(cat "$work/added-before")")"
fi
