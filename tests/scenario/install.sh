#!/usr/bin/env bash
# `gpufence install` / `uninstall` against a real containerd (the system's, Debian's 1.6, or the
# line given) that install really restarts: a private containerd whose config, socket and state live under a fake host root
# ($work/host), restarted by a --restart-command that stops it and starts it again on its config.
# The proof is the running containerd's own CRI status, not the file.
# Usage: install.sh CASE [LINE]
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:?}
[ "$(id -u)" = 0 ] || skip "needs root to run containerd"
case_name=${1:?usage: install.sh CASE [LINE]}
# LINE: the containerd line the private containerd runs, a row of scripts/lib/containerd-lines.tsv
# (default: the system's line); the table's tests column says which cases run on which lines.
line=${2:-$(awk '!/^#/ && $2 == "system" {print $1; exit}' "$gf_lines_table")}
gf_line_field "$line" source >/dev/null || { echo "unknown containerd line '$line' (the lines: $(gf_lines | tr '\n' ' '))"; exit 2; }
bin=$(gf_line_bin "$line") || skip "$bin"
export PATH=$bin:$PATH
config_version=$(gf_line_field "$line" config)
if [ -z "${GF_INSTALL_PRIVATE_NS:-}" ]; then
  # Every case, every line, runs in a private mount namespace: install adds drop-ins whose host
  # path the real containerd resolves in its own root (imports), so the fake host's
  # /etc/containerd is bound at /etc/containerd here, and cleanup's unmounts of /etc/containerd,
  # /usr/local, /opt ... end with this namespace, never touching the host's mounts.
  unshare -m --propagation private true 2>/dev/null || skip "no private mount namespace here (unshare -m)"
  GF_INSTALL_PRIVATE_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
command -v containerd >/dev/null || skip "containerd is not installed (apt-get install containerd)"
command -v ctr >/dev/null || skip "ctr is not installed"

work=$(gf_work_dir gpufence-inst)
host=$work/host
sock=$host/run/containerd/containerd.sock
cfg=$host/etc/containerd/config.toml
cleanup() {
  [ -f "$work/pid" ] && kill "$(cat "$work/pid")" 2>/dev/null
  sleep 0.2
  umount "$cfg" 2>/dev/null
  # Every mount of this run's is in its private namespace and ends with it; these let rm below
  # see plain directories.
  umount /etc/containerd /etc/k0s /usr/local /opt /etc /var/lib /run 2>/dev/null
  umount "$host/etc/containerd" 2>/dev/null
  umount -R "$work/root" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
gf=$build/bin/gpufence
mkdir -p "$host/etc/containerd" "$host/run/containerd" "$host/usr/local/bin" "$host/opt"
# Two fake GPUs the mock NVML answers for, and driver libraries for the CDI spec to mount.
source "$src/scripts/lib/bundle.sh"
gf_make_node_root "$host"
mkdir -p "$host/usr/lib/x86_64-linux-gnu"
for lib in libnvidia-ml.so.550.54.15 libcuda.so.550.54.15; do : > "$host/usr/lib/x86_64-linux-gnu/$lib"; done

# restart.sh: what systemctl restart would do for this private containerd. BROKEN=1 in
# $work/broken makes it stop containerd and not start it again (a containerd that will not come
# back).
cat > "$work/restart.sh" <<SH
#!/bin/sh
if [ -f "$work/pid" ]; then
  p=\$(cat "$work/pid"); kill "\$p" 2>/dev/null
  for i in \$(seq 300); do kill -0 "\$p" 2>/dev/null || break; sleep 0.1; done
fi
rm -f "$work/pid"
echo restart >> "$work/restarts"
[ -f "$work/broken" ] && exit 0
# SLOW=1 in $work/slow: containerd stays down a while (a kill lands inside the restart).
[ -f "$work/slow" ] && { touch "$work/restarting"; sleep 2; rm -f "$work/restarting"; }
# Started from inside a container (the from-image case), leave its cgroups first, as a
# containerd that systemd starts would not be in them.
if [ -n "\${GF_ESCAPE_CGROUP:-}" ]; then for f in /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs; do echo \$\$ > "\$f" 2>/dev/null; done; fi
setsid containerd --config "$cfg" >> "$work/containerd.log" 2>&1 < /dev/null &
echo \$! > "$work/pid"
SH
chmod +x "$work/restart.sh"
answering() { for _ in $(seq 300); do ctr --address "$sock" version >/dev/null 2>&1 && return 0; sleep 0.1; done; return 1; }
start() { sh "$work/restart.sh"; : > "$work/restarts"; answering; }
restarts() { [ -f "$work/restarts" ] && wc -l < "$work/restarts" || echo 0; }
# The user's config: containerd's defaults with a private root, state and socket, and settings
# of their own that must survive byte for byte.
{
  printf '# my own containerd config: keep this comment\nroot = "%s/root"\nstate = "%s/state"\n' "$work" "$work"
  containerd config default | grep -vE '^(root|state) = ' | sed "s|/run/containerd/containerd.sock|$sock|; s|sandbox_image = .*|sandbox_image = \"registry.example/pause:3.9\"|; s|sandbox = '.*'|sandbox = 'registry.example/pause:3.9'|" |
    sed -E "s|socket_path = [\"']/var/run/nri/nri.sock[\"']|socket_path = \"$host/run/nri/nri.sock\"|"
} > "$cfg"
if [ "$case_name" = version3 ]; then
  grep -q '^version = 3' "$cfg" || skip "containerd 2's default config is not version 3: $(grep '^version' "$cfg")"
fi
# The host paths containerd itself resolves, on every line, are this namespace's fake host's:
# imports (/etc/containerd/conf.d), the NRI plugin_path (/opt/nri/plugins) and the link install
# makes there (/usr/local/bin/gpufence-nri), and containerd's own writes (/opt/containerd, the
# runc root under /run/containerd). The machine's are never written.
bind_host_paths() {
  mount --bind "$host/etc/containerd" /etc/containerd || skip "cannot bind-mount over /etc/containerd here"
  mount --bind "$host/usr/local" /usr/local || skip "cannot bind-mount over /usr/local here"
  mount --bind "$host/opt" /opt || skip "cannot bind-mount over /opt here"
}
# /etc (where /etc/containerd and /etc/k0s are made), /var/lib (the plugin containerd launches
# logs to /var/lib/gpufence/runtime.log: its environment is containerd's to set) and /run are
# this run's scratch, not the machine's.
cp -a /etc "$work/etc" && mount --bind "$work/etc" /etc || skip "cannot bind a private /etc here"
mkdir -p /etc/containerd /etc/k0s "$work/var-lib/gpufence"
bind_host_paths
mount --bind "$work/var-lib" /var/lib || skip "cannot bind-mount over /var/lib here"
mount -t tmpfs -o mode=755 gpufence-test-run /run || skip "cannot mount a tmpfs over /run here"
mkdir -p /run/containerd
cp "$cfg" "$work/original.toml"
start || skip "this machine cannot run containerd: $(tail -3 "$work/containerd.log" | tr '\n' ' ')"

export GPUFENCE_NVML_LIBRARY=$build/lib/mock-nvml/default/libnvidia-ml.so.1
export MOCK_NVML_CONFIG=$src/tools/mock-nvml/examples/two-rtx3080.json
ready=20
# The handler's cases ask for it: on 2.3 the default (auto) is NRI (case nri).
install_nri=("$gf" --host-root "$host" install --distribution containerd --host-exec direct
             --restart-command "$work/restart.sh" --nri-socket /run/nri/nri.sock)
install=("${install_nri[@]}" --enforcement runtime)
uninstall=("$gf" --host-root "$host" uninstall --host-exec direct --restart-command "$work/restart.sh" --ready-timeout 20)


# Every path under the fake host but the live run/ (the socket), with each file's bytes: a
# refused install must leave this identical, an uninstall must bring it back.
snap() { (cd "$host" && find . -path ./run -prune -o -printf '%p %y %l %m\n' | sort && find . -path ./run -prune -o -type f -print0 | sort -z | xargs -0 sha256sum); }
dropin=$host/etc/containerd/conf.d/99-gpufence.toml
case $case_name in  # gf:cases
  version4)
    # containerd 2.3's own default: version 4, imports = ['/etc/containerd/conf.d/*.toml'].
    grep -q '^version = 4' "$cfg" || skip "containerd $line's default config is not version 4"
    before=$(snap)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install succeeds on $(containerd --version | awk '{print $3}')" test "$rc" = 0
    check "the drop-in is version 4, as the root file" grep -q '^version = 4' "$dropin"
    check "the user's file is untouched: its own glob imports the drop-in" cmp -s "$cfg" "$work/original.toml"
    check "the running containerd has the handler (CRI status)" grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime" <<<"$out"
    check "containerd's config dump has it" bash -c "containerd --config '$cfg' config dump 2>/dev/null | grep -q 'runtimes.nvidia.options'"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "and the running containerd no longer has the handler" grep -q "containerd no longer has handler nvidia" <<<"$out"
    check "the host is as it was, byte for byte" test "$before" = "$(snap)"
    ;;
  weak-handler)
    # Another conf.d file (sorting after gpufence's) adds pod_annotations admitting cdi.k8s.io/
    # to the handler: containerd merges it into gpufence's handler, BinaryName still gpufence's.
    # Install reads the merged handler from CRI status and fails, the host put back.
    grep -q "conf.d/\*.toml" "$cfg" || skip "containerd $line's default config does not import conf.d/*.toml"
    other=$host/etc/containerd/conf.d/99-z-other.toml
    mkdir -p "$(dirname "$other")"
    printf 'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n  pod_annotations = ["cdi.k8s.io/*"]\n' > "$other"
    before=$(snap)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install fails" test "$rc" = 1
    check "naming the pattern containerd loaded into the handler" grep -q 'pod_annotations pattern "cdi.k8s.io/\*"' <<<"$out"
    check "the host is as it was, byte for byte" test "$before" = "$(snap)"
    check "the running containerd does not have the handler" bash -c "! ctr --address '$sock' version >/dev/null 2>&1 || ! containerd --config '$cfg' config dump 2>/dev/null | grep -q gpufence-runtime"
    rm "$other"
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    check "without that file, install succeeds" test "$rc" = 0 || echo "$out"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    check "and uninstall too" test "$rc" = 0 || echo "$out"
    ;;
  nri)
    # --enforcement nri on containerd 2.3 (NRI v0.12): NRI on, gpufence-nri and the fence required
    # (fail closed) in the drop-in, no handler; the running containerd listens on NRI's socket
    # and its config dump has both; uninstall gives the user's bytes back and the requirement
    # goes with them. auto picks the same mode here.
    grep -q '^version = 4' "$cfg" || skip "containerd $line's default config is not version 4"
    before=$(snap)
    out=$("${install_nri[@]}" --enforcement auto --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install --enforcement auto succeeds on $(containerd --version | awk '{print $3}')" test "$rc" = 0
    check "and chose nri, saying why" grep -q "enforcement .*nri: containerd v2\.3\.[0-9]* has NRI v0.12" <<<"$out"
    check "the user's file is untouched (its glob imports the drop-in)" cmp -s "$cfg" "$work/original.toml"
    check "the drop-in has no handler" bash -c "! grep -q 'runtimes' '$dropin'"
    check "the running containerd listens on NRI's socket" test -S "$host/run/nri/nri.sock"
    check "install verified it" grep -q "containerd listens on NRI socket /run/nri/nri.sock" <<<"$out"
    dump=$(containerd --config "$cfg" config dump 2>/dev/null)
    nri_dump=$(awk '/^ *\[plugins.*io.containerd.nri.v1.nri.\]/{on=1} /^ *\[/{if ($0 !~ /nri.v1.nri/) on=0} on' <<<"$dump")
    echo "$nri_dump"
    check "config dump: NRI on" grep -qE '^ *disable = false' <<<"$nri_dump"
    check "config dump: the default validator on" bash -c "awk '/default_validator/{v=1} v && /enable = true/{f=1} END{exit !f}' <<<\"\$1\"" _ "$nri_dump"
    check "config dump: gpufence-nri and gpufence-fence required" grep -qE "required_plugins = \[.gpufence-nri., .gpufence-fence.\]" <<<"$nri_dump"
    check "config dump: no waiver a pod can set (containerd's default, empty)" grep -qE "tolerate_missing_plugins_annotation = ''$" <<<"$nri_dump"
    check "the state records the mode" grep -q '"enforcement": "nri"' "$host/etc/gpufence/install-state.json"
    check "gpufence-nri is linked into plugin_path as 10-gpufence-nri" test "$(readlink "$host/opt/nri/plugins/10-gpufence-nri")" = /usr/local/bin/gpufence-nri
    check "and again as 20-gpufence-fence, the fence" test "$(readlink "$host/opt/nri/plugins/20-gpufence-fence")" = /usr/local/bin/gpufence-nri
    check "and its binary is the one built" cmp -s "$host$(readlink "$host/usr/local/bin/gpufence-nri")" "$build/bin/gpufence-nri"
    # containerd launched it at the restart from plugin_path, it registered under its NN-name and
    # answered Synchronize (containerd v2.3.4's log, nri@v0.12.0 pkg/adaptation/adaptation.go:
    # startPlugins, syncFn), and it still runs as containerd's child.
    synced='pre-installed NRI plugin \"10-gpufence-nri\" synchronization success'
    for _ in $(seq 300); do grep -qF "$synced" "$work/containerd.log" && break; sleep 0.1; done
    grep -F "10-gpufence-nri" "$work/containerd.log" | tail -4
    check "containerd launched 10-gpufence-nri and it synchronized" grep -qF "$synced" "$work/containerd.log"
    check "containerd found 20-gpufence-fence in plugin_path too" grep -qF 'discovered plugin 20-gpufence-fence' "$work/containerd.log"
    # containerd's child that runs the versioned gpufence-nri (exec'd through the plugin_path link).
    nri_pid=
    for d in /proc/[0-9]*; do
      [ "$(awk '/^PPid:/{print $2}' "$d/status" 2>/dev/null)" = "$(cat "$work/pid")" ] || continue
      [[ "$(readlink "$d/exe")" == /usr/local/lib/gpufence/gpufence-nri-* ]] && nri_pid=${d#/proc/}
    done
    check "gpufence-nri runs as containerd's child, from the versioned file install copied" test -n "$nri_pid"
    sha=$(sha256sum < "$dropin")
    out=$("${install_nri[@]}" --enforcement nri --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "a second install (--enforcement nri) changes nothing" bash -c "test $rc = 0 && grep -q 'nothing to change' <<<\"\$1\"" _ "$out"
    check "and restarts nothing" test "$(restarts)" = 1
    check "the drop-in is as it was" test "$sha" = "$(sha256sum < "$dropin")"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the host is as it was, byte for byte" test "$before" = "$(snap)"
    check "the running config no longer requires gpufence-nri" bash -c "! containerd --config '$cfg' config dump 2>/dev/null | grep -q gpufence-nri"
    ;;
  nri-both)
    # containerd 1.7 (NRI v0.6, off by default; no required_plugins): auto stays on the handler,
    # saying why; --enforcement both adds `disable = false` to the user's file in place beside
    # the handler, containerd then listens on NRI's socket; uninstall gives the bytes back and
    # NRI is off again.
    grep -qE '^ *disable = true' <(awk '/nri.v1.nri/{on=1} on' "$cfg") || skip "containerd $line's default config does not have NRI off"
    before=$(snap)
    out=$("${install_nri[@]}" --enforcement auto --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "auto on $(containerd --version | awk '{print $3}') picks runtime, naming the NRI version" \
      bash -c "test $rc = 0 && grep -q 'enforcement .*runtime: containerd .* has NRI v0.6 (< v0.10' <<<\"\$1\"" _ "$out"
    check "and leaves NRI off" test ! -S "$host/run/nri/nri.sock"
    out=$("${install_nri[@]}" --enforcement both --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install --enforcement both succeeds" test "$rc" = 0
    check "it says NRI enforcement is not guaranteed while gpufence-nri is down" grep -q "not guaranteed while gpufence-nri is down" <<<"$out"
    check "the running containerd has the handler and listens on NRI's socket" \
      grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime; listens on NRI socket /run/nri/nri.sock" <<<"$out"
    check "the socket is there" test -S "$host/run/nri/nri.sock"
    dump=$(containerd --config "$cfg" config dump 2>/dev/null)
    check "config dump: NRI on" bash -c "awk '/io.containerd.nri.v1.nri/{on=1} on && /disable = /{print; exit}' <<<\"\$1\" | grep -q 'disable = false'" _ "$dump"
    check "the user's file keeps its comment" grep -q '^# my own containerd config: keep this comment' "$cfg"
    check "the state records the mode" grep -q '"enforcement": "both"' "$host/etc/gpufence/install-state.json"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the host is as it was, byte for byte" test "$before" = "$(snap)"
    dump=$(containerd --config "$cfg" config dump 2>/dev/null)
    check "NRI is off again in the config" bash -c "awk '/io.containerd.nri.v1.nri/{on=1} on && /disable = /{print; exit}' <<<\"\$1\" | grep -q 'disable = true'" _ "$dump"
    ;;
  refused)
    # The user's file half-edited (containerd still runs on the previous one): install refuses
    # and changes nothing at all.
    printf '\n[plugins.broken\n' >> "$cfg"
    before=$(snap)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install refuses" test "$rc" != 0
    check "naming the config" grep -q "FAILED: containerd config: .*config.toml" <<<"$out"
    check "nothing changed on the host (no binary, link, runtime.toml, CDI spec or state)" test "$before" = "$(snap)"
    check "containerd was not restarted" test "$(restarts)" = 0
    out=$("${uninstall[@]}" 2>&1); rc=$?
    check "uninstall finds nothing installed" bash -c "test $rc = 0 && grep -q 'nothing installed' <<<'$out'"
    ;;
  readonly-main)
    # The root file on a read-only bind mount of its own (rename over it: EBUSY).
    mount --bind "$cfg" "$cfg" && mount -o remount,ro,bind "$cfg" || skip "cannot make a read-only bind mount here"
    before=$(snap)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    if grep -q "^imports = \['/etc/containerd/conf.d/\*.toml'\]" "$cfg"; then
      # 2.3: the user's glob imports the drop-in, the root file is not written at all.
      check "install succeeds without writing the root file" test "$rc" = 0
      check "the root file is untouched" cmp -s "$cfg" "$work/original.toml"
      check "the drop-in is there and recorded" bash -c "test -f '$dropin' && grep -q 99-gpufence.toml '$host/etc/gpufence/install-state.json'"
      out=$("${uninstall[@]}" 2>&1); rc=$?
      echo "$out"
      check "uninstall succeeds" test "$rc" = 0
      check "the host is as it was" test "$before" = "$(snap)"
    else
      check "install fails" test "$rc" = 1
      check "no drop-in is left to arm the handler at the next restart" test ! -e "$dropin"
      check "nothing else is left either (no state, binary, runtime.toml)" test "$before" = "$(snap)"
      check "containerd was not restarted" test "$(restarts)" = 0
    fi
    ;;
  kill|kill-nri)
    # kill-nri: the same with --enforcement nri (containerd >= 2.2: NRI and required_plugins in
    # the drop-in, verified on NRI's socket).
    if [ "$case_name" = kill-nri ]; then
      grep -q '^version = [34]' "$cfg" || skip "containerd $line has no required_plugins (< 2.2)"
      install=("${install_nri[@]}" --enforcement nri)
    fi
    # SIGKILL at every step boundary: strace kills install at the entry of each rename it makes
    # (every journal record and every file write ends with one), and once inside a slow restart.
    # Then uninstall first, or install first (then uninstall): the user's bytes come back.
    command -v strace >/dev/null || skip "strace is not installed"
    mkdir -p "$work/pristine" && cp -a "$host/." "$work/pristine/" && rm -rf "$work/pristine/run"
    before=$(snap)
    reset_host() {
      find "$host" -mindepth 1 -maxdepth 1 ! -name run -exec rm -rf {} + 2>/dev/null
      cp -a "$work/pristine/." "$host/"
      # The bind mounts still name the directories just removed.
      umount /etc/containerd /usr/local /opt && bind_host_paths
      start >/dev/null || echo "containerd did not start on the pristine config"
    }
    strace -o "$work/renames" -e trace=rename,renameat,renameat2 "${install[@]}" --ready-timeout $ready > "$work/count.out" 2>&1
    check "an install under strace succeeds" grep -q '^installed in' "$work/count.out" || cat "$work/count.out"
    "${uninstall[@]}" > /dev/null 2>&1
    mapfile -t calls < <(grep -oE '^(rename|renameat|renameat2)\(' "$work/renames" | tr -d '(')
    echo "install makes ${#calls[@]} renames: ${calls[*]}"
    declare -A seen=()
    points=()
    for c in "${calls[@]}"; do seen[$c]=$(( ${seen[$c]:-0} + 1 )); points+=("$c:${seen[$c]}"); done
    points+=(restart)
    printf 'kill point | then     | result\n'
    for p in "${points[@]}"; do
      for next in uninstall install; do
        reset_host
        if [ "$p" = restart ]; then
          touch "$work/slow"
          "${install[@]}" --ready-timeout $ready > "$work/killed.out" 2>&1 &
          ipid=$!
          for _ in $(seq 100); do [ -f "$work/restarting" ] && break; sleep 0.05; done
          kill -KILL "$ipid"; wait "$ipid" 2>/dev/null
          # The killed install's restart goes on: wait until it has started containerd.
          rm -f "$work/slow"
          for _ in $(seq 100); do [ ! -f "$work/restarting" ] && [ -s "$work/pid" ] && break; sleep 0.05; done
        else
          strace -o /dev/null -e trace=none -e inject="${p%:*}:signal=KILL:when=${p#*:}" \
            "${install[@]}" --ready-timeout $ready > "$work/killed.out" 2>&1
        fi
        if [ "$next" = install ]; then
          out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
          [ "$rc" = 0 ] || { echo "$out"; check "install after a kill at $p succeeds" false; }
        fi
        out=$("${uninstall[@]}" 2>&1); rc=$?
        ok=1
        [ "$rc" = 0 ] || ok=0
        [ "$before" = "$(snap)" ] || ok=0
        printf '%-10s | %-8s | %s\n' "$p" "$next" "$([ $ok = 1 ] && echo "user's bytes back" || echo FAILED)"
        if [ $ok = 0 ]; then echo "$out"; diff <(echo "$before") <(snap) | head; fi
        check "kill at $p, then $next: uninstall exits 0 with the user's bytes back" test $ok = 1
      done
    done
    ;;
  k3s-template)
    # k3s on this containerd line, stood in for by its renderer: at every (re)start k3s renders
    # config-v3.toml.tmpl (containerd 2.x; else config.toml.tmpl) into config.toml, the base
    # template being its own default config (here: this containerd's, with the private paths),
    # and starts containerd on it. The user's template only calls base and adds a comment.
    kdir=$host/var/lib/rancher/k3s/agent/etc/containerd
    mkdir -p "$kdir" "$host/etc/systemd/system" && touch "$host/etc/systemd/system/k3s.service"
    if [ "$config_version" = 2 ]; then tmpl=config.toml.tmpl; else tmpl=config-v3.toml.tmpl; fi
    printf '{{ template "base" . }}\n\n# the user'"'"'s own addition: keep it\n' > "$kdir/$tmpl"
    cp "$kdir/$tmpl" "$work/template.orig"
    cp "$cfg" "$work/base.toml"
    cat > "$work/k3s-restart.sh" <<SH
#!/bin/sh
t="$kdir/config.toml.tmpl"
[ "$config_version" != 2 ] && [ -f "$kdir/config-v3.toml.tmpl" ] && t="$kdir/config-v3.toml.tmpl"
if [ -f "\$t" ]; then
  awk -v base="$work/base.toml" '/\{\{ template "base" \. \}\}/ { while ((getline l < base) > 0) print l; next } { gsub(/\{\{ \.SystemdCgroup \}\}/, "false"); print }' "\$t" > "$kdir/config.toml"
else
  cp "$work/base.toml" "$kdir/config.toml"
fi
cp "$kdir/config.toml" "$cfg.rendered"
exec sh "$work/restart.sh"
SH
    # restart.sh starts containerd on $cfg: point it at what k3s rendered.
    sed -i "s|containerd --config \"$cfg\"|containerd --config \"$kdir/config.toml\"|; s|containerd --config $cfg |containerd --config $kdir/config.toml |" "$work/restart.sh"
    chmod +x "$work/k3s-restart.sh"; sh "$work/k3s-restart.sh"; answering
    before=$(snap)
    out=$("$gf" --host-root "$host" install --distribution k3s --host-exec direct --containerd-socket /run/containerd/containerd.sock \
      --restart-command "$work/k3s-restart.sh" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install succeeds under k3s's stand-in on containerd $line" test "$rc" = 0
    check "the template k3s renders on this line ($tmpl) is the one edited" grep -q "containerd config  changed  /var/lib/rancher/k3s/agent/etc/containerd/$tmpl" <<<"$out"
    check "no other template was created" bash -c "ls '$kdir' | grep -c 'tmpl\$' | grep -qx 1"
    check "the user's template is kept byte for byte ahead of the block" bash -c "head -c $(stat -c %s "$work/template.orig") '$kdir/$tmpl' | cmp -s - '$work/template.orig'"
    check "the running containerd has the handler" grep -q "containerd runs handler nvidia" <<<"$out"
    out=$("$gf" --host-root "$host" uninstall --host-exec direct --containerd-socket /run/containerd/containerd.sock \
      --restart-command "$work/k3s-restart.sh" --ready-timeout 20 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the template is the user's again" cmp -s "$kdir/$tmpl" "$work/template.orig"
    # No user template: the one this line's k3s reads is created (and removed by uninstall).
    rm -f "$kdir"/*.tmpl; sh "$work/k3s-restart.sh"; answering
    out=$("$gf" --host-root "$host" install --distribution k3s --host-exec direct --containerd-socket /run/containerd/containerd.sock \
      --restart-command "$work/k3s-restart.sh" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "without a template, install succeeds" test "$rc" = 0
    check "it created $tmpl" test -f "$kdir/$tmpl"
    check "and the running containerd has the handler" grep -q "containerd runs handler nvidia" <<<"$out"
    check "and only that one" bash -c "ls '$kdir' | grep -c 'tmpl\$' | grep -qx 1"
    out=$("$gf" --host-root "$host" uninstall --host-exec direct --containerd-socket /run/containerd/containerd.sock \
      --restart-command "$work/k3s-restart.sh" --ready-timeout 20 2>&1); rc=$?
    check "uninstall removes it" bash -c "test $rc = 0 && ! ls '$kdir'/*.tmpl 2>/dev/null"
    ;;
  version3)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    dropin=$host/etc/containerd/conf.d/99-gpufence.toml
    check "install succeeds on $(containerd --version | awk '{print $3}')" test "$rc" = 0
    check "it wrote the drop-in" test -f "$dropin"
    check "and listed it in the config's imports" grep -q '^imports = \["/etc/containerd/conf.d/99-gpufence.toml"\]' "$cfg"
    check "the rest of the user's file is byte for byte" bash -c "diff '$work/original.toml' '$cfg' | grep -c '^[<>]' | grep -qx 2"
    check "the running containerd has the handler (CRI status)" grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime" <<<"$out"
    check "the state record lists both files" bash -c "grep -q '99-gpufence.toml' '$host/etc/gpufence/install-state.json' && grep -q '\"/etc/containerd/config.toml\"' '$host/etc/gpufence/install-state.json'"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the config is the user's again, byte for byte" cmp -s "$cfg" "$work/original.toml"
    check "the drop-in is gone" test ! -e "$dropin"
    check "and the running containerd no longer has the handler" grep -q "containerd no longer has handler nvidia" <<<"$out"
    check "no backup is left behind" bash -c "! ls '$host'/etc/containerd/config.toml.bak-* 2>/dev/null"
    ;;
  k0s)
    # A k0s 1.36+ node (containerd 2.x): containerd started as k0s starts it (--root, --state,
    # --address flags, --config=/etc/k0s/containerd.toml) on the file k0s writes (the marker
    # line, version 3, imports = ["/etc/k0s/containerd.d/*.toml"], the CRI sections inline;
    # docs/install.md, "Distributions"). install must write only its own drop-in there, and the
    # running containerd must serve the handler from it.
    k0s_cfg=$host/etc/k0s/containerd.toml
    ksock=$host/run/k0s/containerd.sock
    mkdir -p "$host/etc/k0s/containerd.d" "$host/run/k0s"
    mount --bind "$host/etc/k0s" /etc/k0s || skip "cannot bind-mount over /etc/k0s here"
    printf '%s\n' '# k0s_managed=true' \
      '# This is a placeholder configuration for k0s managed containerd.' \
      'imports = ["/etc/k0s/containerd.d/*.toml"]' 'version = 3' '' '[plugins]' \
      '  [plugins."io.containerd.cri.v1.images"]' \
      '    [plugins."io.containerd.cri.v1.images".pinned_images]' \
      '      sandbox = "registry.example/pause:3.9"' \
      '  [plugins."io.containerd.cri.v1.runtime"]' > "$k0s_cfg"
    printf 'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.other]\n  runtime_type = "io.containerd.runc.v2"\n' > "$host/etc/k0s/containerd.d/other.toml"
    cp "$k0s_cfg" "$work/k0s-original.toml"
    sed "s|containerd --config \"$cfg\"|containerd --root=$work/root --state=$work/state --address=$ksock --config=$k0s_cfg|" "$work/restart.sh" > "$work/restart-k0s.sh"
    chmod +x "$work/restart-k0s.sh"
    grep -q -- "--config=$k0s_cfg" "$work/restart-k0s.sh" || { check "restart-k0s.sh starts containerd as k0s does" false; exit 1; }
    sh "$work/restart-k0s.sh"
    for _ in $(seq 300); do ctr --address "$ksock" version >/dev/null 2>&1 && break; sleep 0.1; done
    k0s_install=("$gf" --host-root "$host" install --distribution k0s --host-exec direct
                 --restart-command "$work/restart-k0s.sh" --enforcement runtime)
    k0s_uninstall=("$gf" --host-root "$host" uninstall --host-exec direct
                   --restart-command "$work/restart-k0s.sh" --ready-timeout 20)
    drop=$host/etc/k0s/containerd.d/gpufence.toml
    out=$("${k0s_install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install succeeds on k0s's layout ($(containerd --version | awk '{print $3}'))" test "$rc" = 0
    check "it wrote its drop-in, version 3, a regular file" bash -c "test -f '$drop' && ! test -L '$drop' && grep -qx 'version = 3' '$drop'"
    check "k0s's containerd.toml is byte for byte" cmp -s "$k0s_cfg" "$work/k0s-original.toml"
    check "the running containerd has the handler (CRI status)" grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime" <<<"$out"
    dump=$(containerd --config "$k0s_cfg" config dump 2>&1)
    check "config dump has the handler and the other drop-in's runtime" bash -c "grep -q 'runtimes.nvidia.options\]' <<<\"\$0\" && grep -q 'runtimes.other\]' <<<\"\$0\"" "$dump"
    out=$("${k0s_install[@]}" --ready-timeout $ready 2>&1); rc=$?
    check "a second install changes nothing" bash -c "test $rc = 0 && grep -q 'nothing to change' <<<\"\$0\"" "$out"
    out=$("${k0s_uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the drop-in is gone" test ! -e "$drop"
    check "the other drop-in and containerd.toml are as they were" bash -c "cmp -s '$k0s_cfg' '$work/k0s-original.toml' && test -f '$host/etc/k0s/containerd.d/other.toml'"
    check "and the running containerd no longer has the handler" grep -q "containerd no longer has handler nvidia" <<<"$out"
    umount /etc/k0s 2>/dev/null
    ;;
  concurrent)
    # Two runs at once (docs/install.md, "One run at a time"): the first install is held inside
    # a slowed restart; a second install and an uninstall with a short --lock-timeout fail,
    # naming its pid, and undo nothing of it; the node ends installed once. Then an install
    # started while an uninstall restarts waits for it and installs afresh; the last uninstall
    # gives the user's bytes back.
    before=$(snap)
    touch "$work/slow"
    "${install[@]}" --ready-timeout $ready > "$work/first.out" 2>&1 &
    first=$!
    for _ in $(seq 200); do [ -f "$work/restarting" ] && break; sleep 0.05; done
    check "the first install is inside its restart" test -f "$work/restarting"
    out=$("${install[@]}" --ready-timeout $ready --lock-timeout 0.5 2>&1); rc=$?
    echo "$out"
    check "a second install fails" test "$rc" = 1
    check "naming the first one's pid" grep -q "FAILED: lock: another gpufence install or uninstall (pid $first) holds /etc/gpufence/install.lock" <<<"$out"
    check "after saying that it waits" grep -q "gpufence install: waiting for another gpufence install or uninstall (pid $first)" <<<"$out"
    out=$("${uninstall[@]}" --lock-timeout 0.5 2>&1); rc=$?
    echo "$out"
    check "an uninstall meanwhile fails the same way" bash -c "test $rc = 1 && grep -q 'FAILED: lock: .*(pid $first)' <<<\"\$1\"" _ "$out"
    rm -f "$work/slow"
    wait "$first"; rc=$?
    cat "$work/first.out"
    check "the first install succeeds" test "$rc" = 0
    check "with one restart, its own" test "$(restarts)" = 1
    check "the running containerd has the handler" grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime" "$work/first.out"
    check "the config has it once" test "$(grep -c 'runtimes.nvidia.options\]' <(containerd --config "$cfg" config dump 2>/dev/null))" = 1
    check "the lock file is gpufence's, 0600, and names no one now" bash -c "test \"\$(stat -c '%a %s' '$host/etc/gpufence/install.lock')\" = '600 0'"
    touch "$work/slow"
    "${uninstall[@]}" > "$work/un.out" 2>&1 &
    un=$!
    for _ in $(seq 200); do [ -f "$work/restarting" ] && break; sleep 0.05; done
    rm -f "$work/slow"
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    wait "$un"; unrc=$?
    cat "$work/un.out"
    echo "$out"
    check "the uninstall it waited for succeeds" test "$unrc" = 0
    check "the install that waited succeeds" test "$rc" = 0
    check "saying whom it waited for" grep -qE "note: waited [0-9.]+ s for another run \(pid $un\)" <<<"$out"
    check "and installed afresh: a restart each" test "$(restarts)" = 3
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "the last uninstall succeeds" test "$rc" = 0
    check "the host is as it was, byte for byte (no lock file left)" test "$before" = "$(snap)"
    ;;
  install-uninstall)
    t0=$(date +%s.%N)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    t1=$(date +%s.%N)
    echo "$out"
    echo "measured: first install took $(echo "$t1 - $t0" | bc) s (restart included)"
    check "install succeeds" test "$rc" = 0
    check "it restarted containerd once" test "$(restarts)" = 1
    check "and says the running containerd has the handler" grep -q "containerd runs handler nvidia -> /usr/local/bin/gpufence-runtime" <<<"$out"
    check "the stable path is a link to a versioned binary" bash -c "readlink '$host/usr/local/bin/gpufence-runtime' | grep -q '^/usr/local/lib/gpufence/gpufence-runtime-[0-9a-f]\{16\}$'"
    check "whose bytes are gpufence-runtime's" cmp -s "$build/bin/gpufence-runtime" "$host$(readlink "$host/usr/local/bin/gpufence-runtime")"
    check "runtime.toml written with the documented defaults" cmp -s "$host/etc/gpufence/runtime.toml" "$src/deploy/runtime.toml"
    check "a CDI spec for the two GPUs" bash -c "grep -q 'name: \"\\?1\"\\?' '$host/etc/cdi/nvidia.yaml' && '$gf' cdi validate '$host/etc/cdi/nvidia.yaml'"
    dump=$(containerd --config "$cfg" config dump)
    check "config dump has the handler" grep -q 'runtimes.nvidia.options\]' <<<"$dump"
    check "the user's sandbox image survives" grep -q 'sandbox_image = "registry.example/pause:3.9"' <<<"$dump"
    check "the user's file is only appended to" bash -c "head -c $(stat -c %s "$work/original.toml") '$cfg' | cmp -s - '$work/original.toml'"
    sha=$(sha256sum < "$cfg")
    t0=$(date +%s.%N)
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    t1=$(date +%s.%N)
    echo "$out"
    echo "measured: second install took $(echo "$t1 - $t0" | bc) s"
    check "a second install succeeds" test "$rc" = 0
    check "changes nothing" test "$sha" = "$(sha256sum < "$cfg")"
    check "restarts nothing" test "$(restarts)" = 1
    check "and says so" grep -q "nothing to change" <<<"$out"
    out=$("${uninstall[@]}" 2>&1); rc=$?
    echo "$out"
    check "uninstall succeeds" test "$rc" = 0
    check "the config is the user's again, byte for byte" cmp -s "$cfg" "$work/original.toml"
    check "containerd was restarted on it" test "$(restarts)" = 2
    check "and no longer runs the handler" grep -q "containerd no longer has handler nvidia" <<<"$out"
    check "setup's backup is gone with it" bash -c "! ls '$host'/etc/containerd/config.toml.bak-* 2>/dev/null"
    check "the binary and link are gone" bash -c "! test -e '$host/usr/local/bin/gpufence-runtime' && ! test -e '$host/usr/local/lib/gpufence'"
    check "runtime.toml and the CDI spec are gone" bash -c "! test -e '$host/etc/gpufence/runtime.toml' && ! test -e '$host/etc/cdi/nvidia.yaml'"
    check "containerd is up" ctr --address "$sock" version
    ;;
  containerd-does-not-come-back)
    touch "$work/broken"
    ready=4
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install fails" test "$rc" = 1
    check "naming the socket that stopped answering" grep -q "FAILED: verify: containerd did not answer on /run/containerd/containerd.sock" <<<"$out"
    check "the previous config is back" cmp -s "$cfg" "$work/original.toml"
    check "and it says so" grep -q "restored the previous /etc/containerd/config.toml" <<<"$out"
    check "no backup is left behind" bash -c "! ls '$host'/etc/containerd/config.toml.bak-* 2>/dev/null"
    rm -f "$work/broken"
    check "containerd starts on the restored config" start
    ;;
  unwritable-config)
    # A read-only bind mount over the config's directory: what root cannot write either.
    mount --bind "$host/etc/containerd" "$host/etc/containerd" && mount -o remount,ro,bind "$host/etc/containerd" \
      || skip "cannot make a read-only bind mount here"
    out=$("${install[@]}" --ready-timeout $ready 2>&1); rc=$?
    echo "$out"
    check "install fails" test "$rc" = 1
    check "saying the config could not be written" grep -q "FAILED: containerd config: .*Read-only file system" <<<"$out"
    check "and that the previous config is left in place" grep -q "previous config is left in place" <<<"$out"
    check "the config is untouched" cmp -s "$cfg" "$work/original.toml"
    check "containerd was not restarted" test "$(restarts)" = 0
    ;;
  watch)
    # install --watch: /healthz follows the handler; a containerd restarted on a config without
    # it (the old file put back by hand) is noticed and the handler put back.
    port=$((20000 + RANDOM % 12000))  # below the kernel's ephemeral ports (32768-60999)
    "${install[@]}" --ready-timeout $ready --watch --interval 0.5 --healthz-address 127.0.0.1:$port > "$work/watch.log" 2>&1 &
    wpid=$!
    healthz() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz"; }
    # 60 s: the first answer comes after a whole install, containerd's restart included.
    wait_for() { for _ in $(seq 600); do [ "$(healthz)" = "$1" ] && return 0; sleep 0.1; done; return 1; }
    check "/healthz answers 200 once installed" wait_for 200
    check "after one restart" test "$(restarts)" = 1
    cp "$work/original.toml" "$cfg"
    sh "$work/restart.sh"   # someone restarts containerd on a config without the handler
    for _ in $(seq 600); do [ "$(restarts)" -ge 3 ] && break; sleep 0.1; done
    check "the watcher re-installed and restarted containerd" test "$(restarts)" = 3
    check "/healthz is 200 again" wait_for 200
    check "the handler is back in the config" grep -q 'runtimes.nvidia.options\]' "$cfg"
    check "the watcher logged why" grep -q "handler missing from the running containerd; installing again" "$work/watch.log"
    kill -TERM "$wpid"; wait "$wpid"
    check "it exits 0 on SIGTERM" test $? = 0
    cat "$work/watch.log"
    ;;
  from-image)
    # The node installer as the chart runs it: gpufence from the image, in a privileged
    # container whose /host is the machine's /, restarting containerd through nsenter into a
    # process of the host (here this test's shell: the machine's PID 1 is not enterable here),
    # verifying over the CRI socket under /host. This containerd runs the installer container
    # and is the one it restarts, as on a node.
    python3 "$src/scripts/image/assemble.py" oci "$build" "$work/image.tar" --work "$work/assemble" > /dev/null \
      || { echo "assemble.py failed"; exit 1; }
    ref=ghcr.io/gpufence/gpufence:0.1.0
    c() { ctr --address "$sock" -n k8s.io "$@"; }
    check "the image imports" c images import "$work/image.tar"
    paths=(--containerd-config "$cfg" --containerd-socket "$sock" --runtime-link "$host/usr/local/bin/gpufence-runtime"
           --versions-dir "$host/usr/local/lib/gpufence" --state-file "$host/etc/gpufence/install-state.json")
    t0=$(date +%s.%N)
    c run -d --privileged --with-ns "pid:/proc/$$/ns/pid" --env GF_ESCAPE_CGROUP=1 \
      --mount "type=bind,src=/,dst=/host,options=rbind:rw" --log-uri "file://$work/installer.log" \
      "$ref" gfinstaller /usr/local/bin/gpufence --host-root=/host install --distribution containerd \
      "${paths[@]}" --runtime-config "$host/etc/gpufence/runtime.toml" --host-exec nsenter --host-pid $$ --restart-command "$work/restart.sh" --cdi skip --ready-timeout 20 \
      > "$work/run.out" 2>&1 || { cat "$work/run.out"; check "ctr run starts the installer" false; }
    for _ in $(seq 300); do
      grep -qE '^(installed in|FAILED:)' "$work/installer.log" 2>/dev/null && break
      sleep 0.1
    done
    t1=$(date +%s.%N)
    cat "$work/installer.log"
    echo "measured: install from the image took $(echo "$t1 - $t0" | bc) s (container start and restart included)"
    check "the installer in the image succeeds" grep -q '^installed in' "$work/installer.log"
    check "it restarted containerd through nsenter" grep -q "restart            changed  nsenter -t $$ -m -u -i -n -p -- sh -c $work/restart.sh" "$work/installer.log"
    check "once" test "$(restarts)" = 1
    check "the running containerd has the handler with the host's path" grep -q "containerd runs handler nvidia -> $host/usr/local/bin/gpufence-runtime" "$work/installer.log"
    check "the shim on the host is the image's" bash -c "'$host/usr/local/bin/gpufence-runtime' --gpufence-help >/dev/null"
    out=$("$gf" uninstall --host-exec direct --restart-command "$work/restart.sh" --ready-timeout 20 "${paths[@]}" 2>&1)
    check "uninstall on the host undoes it" test $? = 0
    echo "$out"
    check "the config is the user's again, byte for byte" cmp -s "$cfg" "$work/original.toml"
    c task rm -f gfinstaller > /dev/null 2>&1; c container rm gfinstaller > /dev/null 2>&1
    ;;
  *) echo "unknown case $1"; exit 2 ;;
esac
[ "$failures" = 0 ] || { echo "containerd log:"; tail -20 "$work/containerd.log" 2>/dev/null; exit 1; }
