#!/bin/sh
# private_dev.sh DIR [COMMAND...]: in the caller's (private) mount namespace, /dev becomes a copy
# of the host's with the GPU nodes a two-GPU node has (195:0, 195:1, nvidiactl 195:255): a tmpfs
# at DIR holding the host's entries (directories bound, nodes copied) and the GPU nodes, bound
# over /dev. The mounts are the namespace's, so they outlive this script; then it execs COMMAND.
# Used by scripts/lib/cri_node.sh (a containerd's own namespace) and scripts/lib/cluster.sh.
set -e
nd=$1; shift
mkdir -p "$nd"
mount -t tmpfs -o mode=755,nosuid tmpfs "$nd"
for e in /dev/* /dev/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=${e#/dev/}
  if [ -d "$e" ] && [ ! -L "$e" ]; then mkdir -p "$nd/$n"; mount --rbind "$e" "$nd/$n"
  else cp -a "$e" "$nd/$n"; fi
done
for m in 0 1; do [ -e "$nd/nvidia$m" ] || mknod -m 666 "$nd/nvidia$m" c 195 $m; done
[ -e "$nd/nvidiactl" ] || mknod -m 666 "$nd/nvidiactl" c 195 255
mount --rbind "$nd" /dev
[ $# -eq 0 ] || exec "$@"
