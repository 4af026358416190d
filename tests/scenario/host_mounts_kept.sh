#!/usr/bin/env bash
# The suite's cleanup paths leave the caller's mounts alone: in an outer private mount namespace
# (this script's own, so the host is never at stake) /opt, /usr/local, /etc/containerd, /etc,
# /var/lib and /run get a sentinel bind mount, then the install scenario runs a case on the
# system's containerd and cleans up (its cleanup unmounts each of them by name). The sentinels
# must still be mounted afterwards: every install case runs in a namespace of its own.
set -uo pipefail
src=${GPUFENCE_SOURCE_DIR:?}
# shellcheck source=scripts/lib/harness.sh
. "$src/scripts/lib/harness.sh"
[ "$(id -u)" = 0 ] || skip "needs root to make a mount namespace"
if [ -z "${GF_SENTINEL_NS:-}" ]; then
  unshare -m --propagation private true 2>/dev/null || skip "no private mount namespace here (unshare -m)"
  GF_SENTINEL_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
targets=(/etc /etc/containerd /opt /usr/local /var/lib /run)
for t in "${targets[@]}"; do
  [ -d "$t" ] || skip "$t is not a directory here"
  mount --bind "$t" "$t" || skip "cannot bind-mount a sentinel at $t"
done
mounted() { awk -v t="$1" '$5 == t {found = 1} END {exit !found}' /proc/self/mountinfo; }
for t in "${targets[@]}"; do check "sentinel at $t mounted before" mounted "$t"; done
# The install case: its own namespace is what keeps the sentinels (GF_INSTALL_PRIVATE_NS unset,
# as when ctest runs it).
env -u GF_INSTALL_PRIVATE_NS bash "$src/tests/scenario/install.sh" refused > "${TMPDIR:-/tmp}/host-mounts-kept.$$.log" 2>&1
rc=$?
[ "$rc" = 77 ] && { cat "${TMPDIR:-/tmp}/host-mounts-kept.$$.log"; rm -f "${TMPDIR:-/tmp}/host-mounts-kept.$$.log"; skip "the install case skipped"; }
rm -f "${TMPDIR:-/tmp}/host-mounts-kept.$$.log"
check "the install case ran (exit $rc)" test "$rc" = 0
for t in "${targets[@]}"; do check "sentinel at $t still mounted after the install case's cleanup" mounted "$t"; done
[ "$failures" = 0 ]
