#!/usr/bin/env bash
# The gpufence image, built offline from the build tree (scripts/image/assemble.py oci),
# imported into a private containerd with `ctr -n k8s.io images import`, and the device plugin
# started from it with `ctr run` against the test kubelet on the host, which admits two
# containers through it (Register, ListAndWatch, GetPreferredAllocation, Allocate).
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
[ "$(id -u)" = 0 ] || skip "needs root to run containerd"
if [ -z "${GF_IMAGE_PRIVATE_NS:-}" ]; then
  # ctr run's shims keep runc's state under /run/containerd/runc: in a namespace of this test's,
  # over a /run of its own, not the machine's.
  unshare -m --propagation private true 2>/dev/null || skip "no private mount namespace here (unshare -m)"
  GF_IMAGE_PRIVATE_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
mount -t tmpfs -o mode=755 gpufence-test-run /run || skip "cannot mount a tmpfs over /run here"
command -v containerd >/dev/null || skip "containerd is not installed (apt-get install containerd)"
command -v ctr >/dev/null || skip "ctr is not installed"
command -v runc >/dev/null || skip "runc is not installed"

work=$(gf_work_dir gpufence-img)
sock=$work/containerd.sock
pid=""
c() { ctr --address "$sock" -n k8s.io "$@"; }
cleanup() {
  c task kill -s KILL gfdp >/dev/null 2>&1; sleep 0.3
  c task rm -f gfdp >/dev/null 2>&1; c container rm gfdp >/dev/null 2>&1
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  umount -R "$work/root" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ref=ghcr.io/gpufence/gpufence:0.1.0

# Step 1: the image, offline.
python3 "$src/scripts/image/assemble.py" oci "$build" "$work/image.tar" --work "$work/assemble" > "$work/image.json" \
  || { echo "assemble.py failed"; cat "$work/image.json"; exit 1; }
python3 - "$work/image.json" "$work/image.tar" <<'PY'
import json, os, sys
i = json.load(open(sys.argv[1]))
print(f"measured: image {i['layer_bytes']/1e6:.1f} MB unpacked, {i['layer_gzip_bytes']/1e6:.1f} MB compressed layer, "
      f"{len(i['libraries'])} shared objects, {i['files']} files; archive {os.path.getsize(sys.argv[2])/1e6:.1f} MB")
PY
check "the image holds no shell" bash -c "! test -e '$work/assemble/rootfs/bin/sh'"
check "the image is reproducible (same tree, same digest)" bash -c \
  "python3 '$src/scripts/image/assemble.py' oci '$build' '$work/again.tar' --work '$work/again' | grep -q \"\$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"manifest\"])' '$work/image.json')\""

# Step 2: a private containerd (own root, state, socket) to import it into.
printf 'version = 2\nroot = "%s/root"\nstate = "%s/state"\n[grpc]\n  address = "%s"\n' "$work" "$work" "$sock" > "$work/config.toml"
containerd --config "$work/config.toml" > "$work/containerd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do ctr --address "$sock" version >/dev/null 2>&1 && break; sleep 0.1; done
ctr --address "$sock" version >/dev/null 2>&1 || skip "this machine cannot run containerd: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"
check "ctr images import accepts the OCI archive" c images import "$work/image.tar"
check "under its reference" bash -c "ctr --address '$sock' -n k8s.io images ls -q | grep -qx '$ref'"
snap=""
c run --rm "$ref" gfprobe /usr/local/bin/gpufence --help > "$work/help" 2>&1 || snap=native
[ -n "$snap" ] && c run --rm --snapshotter native "$ref" gfprobe /usr/local/bin/gpufence --help > "$work/help" 2>&1
snapflag=(); [ -n "$snap" ] && snapflag=(--snapshotter native)
check "gpufence runs from the image (every library it needs is in it)" grep -q "exclusive, provable GPU allocation" "$work/help"
c run --rm "${snapflag[@]}" "$ref" gfns /usr/bin/nsenter --version > "$work/nsenter" 2>&1
check "nsenter, which the node installer restarts containerd through, runs from the image" grep -q "nsenter from util-linux" "$work/nsenter"
c run --rm "${snapflag[@]}" "$ref" gfrt /usr/local/bin/gpufence-runtime --gpufence-help > "$work/rt" 2>&1
check "gpufence-runtime starts from the image" test $? = 0

# Step 3: the device plugin from the image, against the test kubelet on the host.
source "$src/scripts/lib/bundle.sh"
gf_make_node_root "$work/node"
mkdir -p "$work/device-plugins" "$work/mock"
cp "$build/lib/mock-nvml/default/libnvidia-ml.so.1" "$src/tools/mock-nvml/examples/two-rtx3080.json" "$work/mock/"
c run -d "${snapflag[@]}" \
  --mount "type=bind,src=$work/device-plugins,dst=/var/lib/kubelet/device-plugins,options=rbind:rw" \
  --mount "type=bind,src=$work/node,dst=/node,options=rbind:ro" \
  --mount "type=bind,src=$work/mock,dst=/driver,options=rbind:ro" \
  --env MOCK_NVML_CONFIG=/driver/two-rtx3080.json \
  --log-uri "file://$work/plugin.log" "$ref" gfdp /usr/local/bin/gpufence-device-plugin --plugin-dir=/var/lib/kubelet/device-plugins \
  --host-root=/node --nvml-library=/driver/libnvidia-ml.so.1 > "$work/run.out" 2>&1
plugin_task_runs() { c task ls -q | grep -qx gfdp; }
check "ctr run starts the device plugin from the image" plugin_task_runs
"$build/bin/gpufence-test-kubelet" --plugin-dir "$work/device-plugins" --admit 2 --timeout 20 > "$work/alloc" 2> "$work/kubelet.err"
check "it registers and answers Allocate for two containers" test $? = 0
cat "$work/alloc"
check "each container gets one GPU of the two" bash -c "[ \$(grep -c ' ids GPU-' '$work/alloc') = 2 ] && [ \$(awk '/ ids /{print \$3}' '$work/alloc' | sort -u | wc -l) = 2 ]"
check "with the CDI annotation gpufence-runtime trusts" grep -q '^0 annotation cdi.k8s.io/' "$work/alloc"
[ "$failures" = 0 ] || { cat "$work/run.out" "$work/plugin.log" "$work/kubelet.err"; c task ls; tail -20 "$work/containerd.log"; exit 1; }
