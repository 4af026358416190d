#!/usr/bin/env bash
# `gpufence setup containerd` and `setup check-containerd` against a real containerd (Debian's
# 1.6): each config is loaded by containerd itself on a private socket and state directory, and
# `containerd config dump` / `ctr plugins ls` show what containerd made of it.
# Usage: containerd.sh CASE
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
build=${GPUFENCE_BUILD_DIR:?}
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to run containerd"
command -v containerd >/dev/null || skip "containerd is not installed (apt-get install containerd)"
command -v ctr >/dev/null || skip "ctr is not installed"

work=$(mktemp -d /tmp/gpufence-ctd-XXXXXX)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; umount -R "$work/root" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
failures=0
absent() { ! grep -q -- "$1" <<<"$2"; }
check() { if "${@:2}"; then echo "ok   - $1"; else echo "FAIL - $1"; failures=$((failures + 1)); fi; }
gf=$build/bin/gpufence

# private_paths FILE: prepend root/state/socket so this containerd touches nothing of the host's.
private_header() {
  printf 'root = "%s/root"\nstate = "%s/state"\n[grpc]\n  address = "%s/containerd.sock"\n' "$work" "$work" "$work"
}
# start_containerd CONFIG: runs it until the socket answers; sets $pid.
start_containerd() {
  containerd --config "$1" > "$work/containerd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    ctr --address "$work/containerd.sock" version >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "containerd did not come up:"; tail -20 "$work/containerd.log"; return 1
}
stop_containerd() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; }
cri_ok() { ctr --address "$work/containerd.sock" plugins ls | grep -qE 'io\.containerd\.grpc\.v1 +cri .* ok'; }

# Can a containerd run here at all (private root, state and socket)? If not, say why and skip.
{ private_header; } > "$work/preflight.toml"
if ! start_containerd "$work/preflight.toml" >/dev/null; then
  skip "this machine cannot run containerd: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"
fi
stop_containerd

case ${1:?usage: containerd.sh CASE} in
  setup-default-config)
    # containerd config default has its own [grpc] table: take root/state from our header only.
    { private_header | head -2; containerd config default | grep -vE '^(root|state) = ' | sed 's|/run/containerd/containerd.sock|'"$work"'/containerd.sock|'; } > "$work/config.toml"
    check "gpufence setup containerd succeeds" "$gf" setup containerd --config "$work/config.toml" --binary "$build/bin/gpufence-runtime"
    check "a backup was kept" bash -c "ls '$work'/config.toml.bak-* >/dev/null"
    sha_before=$(sha256sum < "$work/config.toml")
    out=$("$gf" setup containerd --config "$work/config.toml" --binary "$build/bin/gpufence-runtime")
    check "running twice changes nothing" test "$sha_before" = "$(sha256sum < "$work/config.toml")"
    check "and says so" grep -q "nothing to change" <<<"$out"
    check "containerd starts with it" start_containerd "$work/config.toml"
    check "the CRI plugin loads" cri_ok
    dump=$(containerd --config "$work/config.toml" config dump)
    check "config dump carries the handler" grep -q 'runtimes.nvidia.options\]' <<<"$dump"
    check "with its BinaryName" grep -q "BinaryName = \"$build/bin/gpufence-runtime\"" <<<"$dump"
    check "runc is still there" grep -q 'runtimes.runc\]' <<<"$dump"
    check "annotations allow-list lets CDI annotations through" grep -q 'container_annotations = \["cdi.k8s.io/\*"\]' <<<"$dump"
    check "check-containerd is clean" "$gf" setup check-containerd --config "$work/config.toml"
    ;;
  seed-snippet)
    { printf 'version = 2\n'; private_header; grep -v '^version' "$src/tests/fixtures/containerd/seed-snippet.toml"; } > "$work/config.toml"
    check "containerd accepts the seed's snippet without complaint" start_containerd "$work/config.toml"
    check "the CRI plugin loads" cri_ok
    dump=$(containerd --config "$work/config.toml" config dump)
    check "but the nvidia runtime is silently gone" absent 'runtimes.nvidia' "$dump"
    check "and the CRI runtimes hold only runc" grep -q 'io.containerd.grpc.v1.cri".containerd.runtimes.runc\]' <<<"$dump"
    stop_containerd
    out=$("$gf" setup check-containerd --config "$work/config.toml")
    rc=$?
    check "check-containerd exits 1" test "$rc" = 1
    for id in runtime-under-v1-linux runtime-engine-ignored unknown-runc-option handler-missing; do
      check "check-containerd names $id" grep -q "id:       containerd.$id" <<<"$out"
    done
    check "gpufence setup containerd repairs it" "$gf" setup containerd --config "$work/config.toml" --binary "$build/bin/gpufence-runtime"
    check "containerd starts with the repaired config" start_containerd "$work/config.toml"
    check "the CRI plugin loads" cri_ok
    dump=$(containerd --config "$work/config.toml" config dump)
    check "the handler is now in the CRI table" grep -q 'io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options\]' <<<"$dump"
    ;;
  broken-config)
    printf 'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n' > "$work/config.toml"
    cp "$work/config.toml" "$work/before"
    "$gf" setup containerd --config "$work/config.toml" > "$work/out" 2>&1
    check "setup refuses a broken config" test $? = 2
    check "naming the file and line" grep -q "$work/config.toml:2:" "$work/out"
    check "and leaves it alone" cmp -s "$work/config.toml" "$work/before"
    "$gf" setup check-containerd --config "$work/config.toml" > "$work/out" 2>&1
    check "check-containerd exits 2 on it" test $? = 2
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" = 0 ] || { echo "containerd log:"; tail -20 "$work/containerd.log" 2>/dev/null; exit 1; }
