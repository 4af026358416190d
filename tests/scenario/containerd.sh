#!/usr/bin/env bash
# `gpufence setup containerd` and `setup check-containerd` against a real containerd (Debian's
# 1.6): each config is loaded by containerd itself on a private socket and state directory, and
# `containerd config dump` / `ctr plugins ls` show what containerd made of it.
# Usage: containerd.sh CASE
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
[ "$(id -u)" = 0 ] || skip "needs root to run containerd"
command -v containerd >/dev/null || skip "containerd is not installed (apt-get install containerd)"
command -v ctr >/dev/null || skip "ctr is not installed"

work=$(gf_work_dir gpufence-ctd)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; umount -R "$work/root" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
absent() { ! grep -q -- "$1" <<<"$2"; }
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
    # ctr blocks on a socket nobody serves: bound it, and stop waiting once containerd exited.
    timeout 3 ctr --address "$work/containerd.sock" version >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "containerd did not come up:"; tail -20 "$work/containerd.log"; return 1
}
stop_containerd() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=""; }
cri_ok() { timeout 10 ctr --address "$work/containerd.sock" plugins ls | grep -qE 'io\.containerd\.grpc\.v1 +cri .* ok'; }

# Can a containerd run here at all (private root, state and socket)? If not, say why and skip.
{ private_header; } > "$work/preflight.toml"
if ! start_containerd "$work/preflight.toml" >/dev/null; then
  skip "this machine cannot run containerd: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"
fi
stop_containerd

case ${1:?usage: containerd.sh CASE} in  # gf:cases
  check-version4)
    # containerd 2.3's own default (version 4): check-containerd judges it, setup adds a version-4
    # drop-in that containerd 2.3 itself loads (v2.3.7, scripts/fetch-containerd.sh).
    bash "$src/scripts/fetch-containerd.sh" 2.3 >/dev/null ||
      skip "containerd 2.3: $(cat "$build/containerd/2.3/FETCH-FAILED" 2>/dev/null || echo 'unpack failed')"
    c23=$build/containerd/2.3/root/usr/bin/containerd
    sed "s|'/etc/containerd/conf.d/\*.toml'|'$work/conf.d/*.toml'|" "$src/tests/fixtures/containerd/containerd-2.3-config-default.toml" > "$work/config.toml"
    cp "$work/config.toml" "$work/original.toml"
    out=$("$gf" setup check-containerd --config "$work/config.toml" 2>&1)
    echo "$out"
    check "check-containerd reads version 4 (no parse refusal)" absent "unsupported config version" "$out"
    check "and finds the handler missing" grep -q "nvidia" <<<"$out"
    check "setup containerd succeeds on it" "$gf" setup containerd --config "$work/config.toml" --binary "$build/bin/gpufence-runtime"
    check "the drop-in is version 4, as the root file" grep -q '^version = 4' "$work/conf.d/99-gpufence.toml"
    check "the root file is untouched: its glob imports the drop-in" cmp -s "$work/config.toml" "$work/original.toml"
    dump=$("$c23" --config "$work/config.toml" config dump 2>&1)
    check "containerd 2.3's config dump carries the handler" grep -q "runtimes.nvidia.options\]" <<<"$dump"
    check "with its BinaryName" grep -q "BinaryName = '$build/bin/gpufence-runtime'" <<<"$dump"
    out=$("$gf" setup check-containerd --config "$work/config.toml" 2>&1)
    # Left: only that CDI is on (version 3-4) with no nvidia.com/gpu spec on this machine.
    check "check-containerd finds the handler now" absent "containerd.handler-" "$out"
    check "and nothing but the missing CDI spec" bash -c "grep '  id:' <<<\"\$1\" | grep -v containerd.cdi-no-gpu-spec | grep -q . && exit 1 || exit 0" _ "$out"
    ;;
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
      check "check-containerd names $id" grep -qF "[containerd.$id]" <<<"$out"
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
  real-configs)
    # Configs as users have them (tests/fixtures/containerd), set up by gpufence and loaded by
    # this containerd: the handler is runc v2 with gpufence's BinaryName, inherits the default
    # runtime's cgroup driver, and nothing of a v1 runc's options.Runtime survives.
    fx=$src/tests/fixtures/containerd
    for f in containerd-1.6-config-default runc-v1-linux crun-default-systemd; do
      if [ "$f" = containerd-1.6-config-default ]; then
        { private_header | head -2; grep -vE '^(root|state) = ' "$fx/$f.toml" | sed 's|/run/containerd/containerd.sock|'"$work"'/containerd.sock|'; } > "$work/$f.toml"
      else
        # crun is not installed here: the default runtime's binary is runc (containerd does not
        # care at load time, check-containerd does).
        { grep '^version' "$fx/$f.toml"; private_header; grep -v '^version' "$fx/$f.toml"; } | sed "s|/usr/bin/crun|$(command -v runc)|" > "$work/$f.toml"
      fi
      check "$f: setup succeeds" "$gf" setup containerd --config "$work/$f.toml" --binary "$build/bin/gpufence-runtime"
      check "$f: containerd starts with it" start_containerd "$work/$f.toml"
      check "$f: the CRI plugin loads" cri_ok
      stop_containerd
      dump=$(containerd --config "$work/$f.toml" config dump)
      h=$(awk '/runtimes\.nvidia\]$/{on=1} on&&/^ *\[/&&!/runtimes\.nvidia/{on=0} on' <<<"$dump")
      check "$f: handler is runc v2" grep -q 'runtime_type = "io.containerd.runc.v2"' <<<"$h"
      check "$f: with gpufence's BinaryName" grep -q "BinaryName = \"$build/bin/gpufence-runtime\"" <<<"$h"
      check "$f: container annotations let CDI through" grep -q 'container_annotations = \["cdi.k8s.io/\*"\]' <<<"$h"
      check "$f: no options.Runtime" absent 'Runtime = ' "$h"
      check "$f: check-containerd is clean" "$gf" setup check-containerd --config "$work/$f.toml"
    done
    h=$(containerd --config "$work/runc-v1-linux.toml" config dump | awk '/runtimes\.nvidia\]$/{on=1} on&&/^ *\[/&&!/runtimes\.nvidia/{on=0} on')
    check "runc-v1-linux: the systemd cgroup driver is inherited" grep -q 'SystemdCgroup = true' <<<"$h"
    h=$(containerd --config "$work/crun-default-systemd.toml" config dump | awk '/runtimes\.nvidia\]$/{on=1} on&&/^ *\[/&&!/runtimes\.nvidia/{on=0} on')
    check "crun default: SystemdCgroup comes from crun, the default runtime" grep -q 'SystemdCgroup = true' <<<"$h"
    # --set-as-default (with the explicit flag) keeps every comment and loads.
    { private_header; cat "$fx/runc-v1-shim.toml"; } | sed '0,/^version/{/^version/d}' | { echo 'version = 2'; cat; } > "$work/default.toml"
    grep '^ *#' "$work/default.toml" > "$work/comments.before"
    check "set-as-default with --include-node-agents succeeds" "$gf" setup containerd --config "$work/default.toml" --binary "$build/bin/gpufence-runtime" --set-as-default --include-node-agents
    check "every comment is still there" bash -c "grep '^ *#' '$work/default.toml' | grep -vF 'Added by gpufence' | cmp -s - '$work/comments.before'"
    check "containerd starts with it" start_containerd "$work/default.toml"
    check "the CRI plugin loads" cri_ok
    stop_containerd
    check "the default runtime is the handler" grep -q 'default_runtime_name = "nvidia"' <<<"$(containerd --config "$work/default.toml" config dump)"
    # k3s: the block setup writes, rendered the way k3s renders it (base = a real config,
    # {{ .SystemdCgroup }} filled in), is a config containerd loads.
    mkdir -p "$work/k3s"
    cp "$fx/k3s-config.toml.tmpl" "$work/k3s/config.toml.tmpl"
    check "k3s: setup succeeds" "$gf" setup containerd --flavor k3s --config "$work/k3s/config.toml.tmpl" --binary "$build/bin/gpufence-runtime"
    base=$( { private_header | head -2; containerd config default | grep -vE '^(root|state) = ' | sed 's|/run/containerd/containerd.sock|'"$work"'/containerd.sock|'; } )
    awk -v base="$base" '/\{\{ template "base" \. \}\}/{print base; next} {gsub(/\{\{ \.SystemdCgroup \}\}/, "true"); print}' "$work/k3s/config.toml.tmpl" > "$work/k3s/config.toml"
    check "k3s: the rendered config starts" start_containerd "$work/k3s/config.toml"
    check "k3s: the CRI plugin loads" cri_ok
    stop_containerd
    h=$(containerd --config "$work/k3s/config.toml" config dump | awk '/runtimes\.nvidia\]$/{on=1} on&&/^ *\[/&&!/runtimes\.nvidia/{on=0} on')
    check "k3s: the handler carries container_annotations" grep -q 'container_annotations = \["cdi.k8s.io/\*"\]' <<<"$h"
    check "k3s: and k3s's cgroup driver" grep -q 'SystemdCgroup = true' <<<"$h"
    # k3s with nvidia-container-runtime on the node renders runtimes."nvidia" itself: setup picks
    # another name, and the rendered result still loads (no duplicate table).
    cp "$fx/k3s-rendered-nvidia.toml" "$work/k3s/config.toml"
    cp "$fx/k3s-config.toml.tmpl" "$work/k3s/config.toml.tmpl"
    mkdir -p "$work/hostk3s/var/lib/rancher/k3s/agent/etc/containerd"
    cp "$work/k3s/config.toml" "$work/k3s/config.toml.tmpl" "$work/hostk3s/var/lib/rancher/k3s/agent/etc/containerd/"
    out=$("$gf" --host-root "$work/hostk3s" setup containerd --flavor k3s --binary /usr/local/bin/gpufence-runtime)
    check "k3s collision: says it renamed the handler" grep -q "handler is named 'gpufence'" <<<"$out"
    check "k3s collision: the RuntimeClass names it" grep -q '^handler: gpufence' <<<"$out"
    tmpl="$work/hostk3s/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    nv=$(sed -n '/runtimes\."nvidia"\]/,$p' "$fx/k3s-rendered-nvidia.toml")
    awk -v base="$base" -v nv="$nv" '/\{\{ template "base" \. \}\}/{print base; print nv; next} {gsub(/\{\{ \.SystemdCgroup \}\}/, "true"); print}' "$tmpl" > "$work/k3s/rendered2.toml"
    check "k3s collision: base + k3s's nvidia + gpufence's block loads" start_containerd "$work/k3s/rendered2.toml"
    stop_containerd
    # A handler that would let pods write cdi.k8s.io/ annotations is an error.
    awk '/runtimes\.nvidia\]$/{on=1; print; next} /^\[/{on=0} on && /pod_annotations = \[\]/{sub(/\[\]/, "[\"cdi.k8s.io/*\"]")} {print}' "$work/containerd-1.6-config-default.toml" > "$work/podann.toml"
    out=$("$gf" setup check-containerd --config "$work/podann.toml")
    check "pod_annotations admitting cdi.k8s.io/: check-containerd exits 1" test $? = 1
    check "and names it" grep -qF '[containerd.pod-annotations-cdi]' <<<"$out"
    ;;
  file-safety)
    # The user's file is never lost.
    mkdir -p "$work/cwd" "$work/real"
    { private_header | head -2; containerd config default | grep -vE '^(root|state) = ' | sed 's|/run/containerd/containerd.sock|'"$work"'/containerd.sock|'; } > "$work/real/config.toml"
    ln -s "$work/real/config.toml" "$work/cwd/config.toml"
    cp "$work/real/config.toml" "$work/original"
    # Relative --config: the file in the current directory (not /config.toml).
    out=$(cd "$work/cwd" && "$gf" setup containerd --config config.toml --binary /opt/a/gpufence-runtime 2>&1)
    check "relative --config works" test $? = 0
    check "a symlinked config stays a symlink" test -L "$work/cwd/config.toml"
    check "to an updated target" grep -qE "BinaryName = [\"']/opt/a/gpufence-runtime" "$work/real/config.toml"
    (cd "$work/cwd" && "$gf" setup containerd --config config.toml --binary /opt/b/gpufence-runtime >/dev/null 2>&1)
    check "a second run in the same second succeeds" grep -qE "BinaryName = [\"']/opt/b/gpufence-runtime" "$work/real/config.toml"
    n=$(ls "$work/cwd"/config.toml.bak-* 2>/dev/null | wc -l)
    check "two runs keep two backups" test "$n" = 2
    check "one of them is the user's original" bash -c "for b in '$work'/cwd/config.toml.bak-*; do cmp -s \"\$b\" '$work/original' && exit 0; done; exit 1"
    check "containerd loads the config through the symlink" start_containerd "$work/cwd/config.toml"
    check "the CRI plugin loads" cri_ok
    stop_containerd
    cp "$work/real/config.toml" "$work/before"
    out=$("$gf" setup containerd --config "$work/cwd/config.toml" --set-as-default 2>&1)
    check "--set-as-default alone is refused" test $? = 2
    check "saying why" grep -q "gpufence-device-plugin is privileged" <<<"$out"
    check "and the file is unchanged" cmp -s "$work/real/config.toml" "$work/before"
    # --host-root: setup edits the file under the root, never the machine's own.
    mkdir -p "$work/host/etc/containerd"
    printf 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n' > "$work/host/etc/containerd/config.toml"
    own=$(sha256sum /etc/containerd/config.toml 2>/dev/null || echo absent)
    check "setup honours --host-root" "$gf" --host-root "$work/host" setup containerd
    check "it edited the file under the root" grep -q 'runtimes.nvidia' "$work/host/etc/containerd/config.toml"
    check "and left the machine's own alone" test "$own" = "$(sha256sum /etc/containerd/config.toml 2>/dev/null || echo absent)"
    out=$("$gf" --host-root "$work/host" setup containerd --config rel.toml 2>&1)
    check "a relative --config under --host-root is refused" test $? = 2
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" = 0 ] || { echo "containerd log:"; tail -20 "$work/containerd.log" 2>/dev/null; exit 1; }
