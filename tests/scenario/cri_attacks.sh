#!/usr/bin/env bash
# Attacks through containerd's CRI, as pods would make them (the test kubelet,
# gpufence-test-cri, a private containerd of the line, the gpufence handler):
#   log-planted  a pod with a writable hostPath over gpufence-runtime's log directory replaces
#                the log with a link to a host file (then a FIFO); a second pod's env carries
#                shell syntax. Nothing may be written outside, and the second pod still runs.
#   cgroupfs-race a pod's hostPath source is swapped between a directory and a link to
#                /sys/fs/cgroup while pods are created: no pod may start holding the host's
#                cgroup filesystem; the cgroup-mounts hook refuses those the path check passed.
# Usage: cri_attacks.sh LINE CASE     LINE = 1.6 | 1.7 | 2
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${GPUFENCE_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
build=${GPUFENCE_BUILD_DIR:-$src/build}
line=${1:?usage: cri_attacks.sh LINE CASE}
case_name=${2:?usage: cri_attacks.sh LINE CASE}
GF_CRI_WORK_PREFIX=gpufence-cri-attack
# shellcheck source=scripts/lib/cri_node.sh disable=SC2034,SC2154
. "$src/scripts/lib/cri_node.sh"
bb=/bin/busybox  # the app image's busybox, for the applets it has no link for

case $case_name in  # gf:cases
  log-planted)
    outside=$work/outside; mkdir -p "$outside" "$work/logs/gpufence"; : > "$outside/ld.so.preload"
    sed -i "s|^file = .*|file = \"$work/logs/gpufence/runtime.log\"|" "$work/runtime.toml"
    for what in symlink fifo; do
      plant="$bb ln -s $outside/ld.so.preload /v/gpufence/runtime.log"
      [ "$what" = fifo ] && plant="mknod /v/gpufence/runtime.log p"
      # The planting pod: plain runc or not, it only needs the hostPath (a log shipper's).
      RUN_EXEC="$bb rm -rf /v/gpufence/runtime.log; $plant; echo PLANTED" \
        run_pods "plant-${what}" runc 1 --gpus 0 --volume "$work/logs:/v:rw"
      check "$what: the planting pod ran" grep -q PLANTED "$work/plant-${what}.out"
      RUN_EXEC='echo CVD=$CUDA_VISIBLE_DEVICES' \
        run_pods "victim-${what}" gpufence 1 --env 'NVIDIA_VISIBLE_DEVICES= /var/log/pwn.so $(touch /tmp/pwned) `id`'
      check "$what: the next GPU pod through gpufence still runs" test "$(cat "$work/victim-${what}.rc")" = 0
      check "$what: and gets its GPU" grep -q "CVD=GPU-" "$work/victim-${what}.out"
      check "$what: nothing was written outside" test ! -s "$outside/ld.so.preload"
      check "$what: the planted $what is still what is there" test "-${what:0:1}" = -s -a -L "$work/logs/gpufence/runtime.log" -o "-${what:0:1}" = -f -a -p "$work/logs/gpufence/runtime.log"
    done
    ;;
  cgroupfs-race)
    [ -d /sys/fs/cgroup/devices ] || skip "no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices: the escape this race aims at needs one"
    race=$work/race; mkdir -p "$race/vol"
    gf_cgroupfs_swapper "$race/vol" &
    swapper=$!
    # At least $tries pods; past that, more (up to five times as many) until one has started, so
    # that the check of a pod that started is not left to chance: a pod starts only when
    # containerd, the shim's path check and runc's mount all found the directory (here 2 to 6
    # of 40), and 40 pods with none started were seen once on a loaded CI machine.
    tries=${GPUFENCE_CRI_RACE_TRIES:-40} started=0 wins=0 hook=0 path=0 other=0 i=0
    while [ "$i" -lt "$tries" ] || { [ "$started" -eq 0 ] && [ "$i" -lt $((tries * 5)) ]; }; do
      i=$((i + 1))
      GF_CRI_QUIET=1 RUN_EXEC='ls /data/devices/devices.list >/dev/null 2>&1 && echo SEES-HOST-CGROUPFS; echo DONE' \
        run_pods "race$i" gpufence 1 --gpus 0 --volume "$race/vol:/data:rw" --timeout 10
      if grep -q DONE "$work/race$i.out"; then
        started=$((started + 1))
        grep -q SEES-HOST-CGROUPFS "$work/race$i.out" && wins=$((wins + 1))
      elif grep -q "the container's mounts hold" "$work/race$i.out"; then hook=$((hook + 1))
      elif grep -q "cgroup filesystem: a container could move" "$work/race$i.out"; then path=$((path + 1))
      else other=$((other + 1)); fi
    done
    check "the swapper raced to the end" kill -0 "$swapper"
    kill "$swapper" 2>/dev/null; wait "$swapper" 2>/dev/null
    echo "cri race: $i pods: $started started, $wins with the host's cgroupfs, $path refused by the path check, $hook refused by the cgroup-mounts hook, $other failed otherwise"
    check "no pod started holding the host's cgroup filesystem" test "$wins" -eq 0
    check "some pods started (the swapper leaves the directory in place half the time)" test "$started" -gt 0
    mkdir -p "$work/honest"
    GF_CRI_QUIET=1 RUN_EXEC='echo DONE' run_pods honest gpufence 2 --gpus 0 --volume "$work/honest:/data:rw"
    check "honest pods with a bind volume run" test "$(grep -c DONE "$work/honest.out")" -ge 2
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
[ "$failures" -eq 0 ] || { echo "$failures check(s) failed on containerd $line"; tail -30 "$work/containerd.log"; exit 1; }
echo "containerd $line: all checks passed"
