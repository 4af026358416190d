#!/usr/bin/env bash
# fetch-containerd.sh [LINE...]: containerd 1.7 (Debian trixie) and 2.x (Debian sid), unpacked
# under the build tree, for the CRI scenario tests (docs/containerd-lines.md). Line 1.6 is the
# system's own (Debian 12). Nothing in the system's apt configuration changes: apt runs with a
# private source list, state and cache under the build tree, on the mirror the system already uses.
# Line 2.3 (v2.3.4, NRI API v0.12; no Debian package has it) is unpacked from the test tools kept
# beside the repository: $GPUFENCE_TEST_TOOLS, default ../shared/tools, file
# containerd-2.3.4-linux-amd64.tar.xz (containerd, containerd-shim-runc-v2, ctr).
#
# Idempotent: a line already unpacked is not fetched again. Offline-safe: a line that cannot be
# fetched is reported on stderr and left absent; the exit status is 0 when every requested line is
# there, 1 otherwise, and callers (tests) skip with the reason printed in
# build/containerd/<line>/FETCH-FAILED.
#
# Result per line: build/containerd/<line>/root/usr/bin/{containerd,containerd-shim-runc-v2,ctr}
# and build/containerd/<line>/VERSION.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
cache=$build/containerd
lines=("$@")
[ ${#lines[@]} -gt 0 ] || lines=(1.7 2)

suite_of() {
  case $1 in
    1.7) echo trixie ;;
    2) echo sid ;;
    *) return 1 ;;
  esac
}

# The Debian mirror this system already uses (deb822 .sources first, then one-line lists);
# GF_DEBIAN_MIRROR overrides it (e.g. to check the offline path with an unreachable one).
system_mirror() {
  local uri
  [ -n "${GF_DEBIAN_MIRROR:-}" ] && { echo "$GF_DEBIAN_MIRROR"; return; }
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v -- '-security' | head -1)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' | grep -v -- '-security' | head -1)
  [ -n "$uri" ] || uri=http://deb.debian.org/debian
  echo "$uri"
}

# unpack_tools_build DIR: line 2.3 from the test tools' tarball into DIR/root/usr/bin.
unpack_tools_build() {
  local dir=$1 tools=${GPUFENCE_TEST_TOOLS:-$here/../shared/tools} tarball
  tarball=$tools/containerd-2.3.4-linux-amd64.tar.xz
  [ -f "$tarball" ] || { echo "$tarball is absent (set GPUFENCE_TEST_TOOLS to the directory holding it)"; return 1; }
  rm -rf "$dir/root.tmp" && mkdir -p "$dir/root.tmp/usr/bin"
  tar -xJf "$tarball" -C "$dir/root.tmp" || { echo "cannot unpack $tarball"; return 1; }
  mv "$dir/root.tmp/containerd-2.3.4/"* "$dir/root.tmp/usr/bin/" && rmdir "$dir/root.tmp/containerd-2.3.4" ||
    { echo "$tarball does not hold containerd-2.3.4/"; return 1; }
  [ -x "$dir/root.tmp/usr/bin/containerd" ] || { echo "$tarball has no containerd"; return 1; }
  rm -rf "$dir/root" && mv "$dir/root.tmp" "$dir/root"
  "$dir/root/usr/bin/containerd" --version | awk '{print substr($3, 2)}' > "$dir/VERSION"
  rm -f "$dir/FETCH-FAILED"
}

# fetch LINE: prints nothing on success; the reason on failure (also kept in FETCH-FAILED).
fetch() {
  local line=$1 suite dir apt_dir deb mirror out
  if [ "$line" = 2.3 ]; then
    dir=$cache/$line
    mkdir -p "$dir"
    exec 9>"$cache/.$line.lock"
    flock 9
    if [ -x "$dir/root/usr/bin/containerd" ] && [ -s "$dir/VERSION" ]; then return 0; fi
    unpack_tools_build "$dir"
    return
  fi
  suite=$(suite_of "$line") || { echo "unknown containerd line '$line' (1.7, 2 or 2.3)"; return 1; }
  dir=$cache/$line
  mkdir -p "$dir"
  # One fetch a line at a time (tests of one build tree may run in parallel).
  exec 9>"$cache/.$line.lock"
  flock 9
  if [ -x "$dir/root/usr/bin/containerd" ] && [ -s "$dir/VERSION" ]; then return 0; fi
  command -v apt-get >/dev/null || { echo "apt-get is not available"; return 1; }
  command -v dpkg-deb >/dev/null || { echo "dpkg-deb is not available"; return 1; }
  mirror=$(system_mirror)
  apt_dir=$cache/apt-$suite
  mkdir -p "$apt_dir/sources" "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" "$dir"
  : > "$apt_dir/state/status"  # not the system's dpkg status: its installed containerd is no candidate
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
    "$mirror" "$suite" "$keyring" > "$apt_dir/sources/$suite.sources"
  local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/sources"
    -o "Dir::State=$apt_dir/state" -o "Dir::State::status=$apt_dir/state/status" -o "Dir::Cache=$apt_dir/cache" -o Dir::Etc::Preferences=/dev/null
    -o Dir::Etc::PreferencesParts=/dev/null -o Acquire::Retries=1 -o Acquire::http::Timeout=20)
  if ! out=$("${apt[@]}" --error-on=any update 2>&1); then
    echo "apt-get update for $suite on $mirror failed: $(tail -2 <<<"$out" | tr '\n' ' ')"
    return 1
  fi
  if ! out=$(cd "$apt_dir/cache/archives" && "${apt[@]}" download containerd 2>&1); then
    echo "apt-get download containerd ($suite) failed: $(tail -2 <<<"$out" | tr '\n' ' ')"
    return 1
  fi
  deb=$(ls -t "$apt_dir"/cache/archives/containerd_*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || { echo "apt-get download containerd ($suite) left no .deb"; return 1; }
  rm -rf "$dir/root.tmp" && mkdir -p "$dir/root.tmp"
  dpkg-deb -x "$deb" "$dir/root.tmp" || { echo "dpkg-deb -x $deb failed"; return 1; }
  [ -x "$dir/root.tmp/usr/bin/containerd" ] || { echo "$deb has no usr/bin/containerd"; return 1; }
  local version
  version=$(dpkg-deb -f "$deb" Version)
  case $version in
    "$line".*) ;;
    *) echo "$suite offers containerd $version, not line $line"; return 1 ;;
  esac
  rm -rf "$dir/root" && mv "$dir/root.tmp" "$dir/root"
  echo "$version" > "$dir/VERSION"
  rm -f "$dir/FETCH-FAILED"
  rm -rf "$apt_dir"  # the package lists (about 50 MB a suite) are not needed again
}

status=0
for line in "${lines[@]}"; do
  if ! why=$(fetch "$line"); then
    mkdir -p "$cache/$line"
    echo "$why" > "$cache/$line/FETCH-FAILED"
    echo "fetch-containerd: containerd $line not available: $why" >&2
    status=1
  elif [ -n "$why" ]; then
    echo "$why"
  else
    echo "fetch-containerd: containerd $line: $(cat "$cache/$line/VERSION") in $cache/$line/root"
  fi
done
exit $status
