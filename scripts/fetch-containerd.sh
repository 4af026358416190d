#!/usr/bin/env bash
# fetch-containerd.sh [LINE...]: the containerd lines the CRI scenario tests run
# (docs/containerd-lines.md), under the build tree. Which lines there are, and where each comes
# from, is the table scripts/lib/containerd-lines.tsv: with no LINE, every line a test runs on
# that is not the system's own (Debian 12's 1.6).
# debian:<suite> lines: apt runs with a private source list, state and cache under the build tree,
# on the mirror the system already uses; nothing in the system's apt configuration changes.
# go lines (no Debian package has them): built from the Go module proxy, `go install
# github.com/containerd/containerd/v2/cmd/{containerd,containerd-shim-runc-v2,ctr}@VERSION` with
# CGO_ENABLED=0 (static binaries, no C headers needed), upstream's build tags and its version
# ldflags, so `containerd --version` and CRI's runtime_version say VERSION. Go's module and build
# caches are the user's (`go env GOMODCACHE GOCACHE`: ~/go/pkg/mod, ~/.cache/go-build), so a new
# build tree only relinks. The Go used: $GF_GO, else `go` on PATH, else /usr/local/go/bin/go (any
# Go >= 1.21: with GOTOOLCHAIN=auto it fetches the toolchain the module asks for from the same
# proxy); with none, the Go toolchain module from the proxy (pinned, checked by SHA-256) unpacked
# under ${XDG_CACHE_HOME:-~/.cache}/gpufence. Cold, a line takes minutes (docs/testing.md).
#
# Idempotent: a line already there (its VERSION the one pinned) is not fetched again; one
# fetch a line at a time (flock: the tests of one build tree run in parallel, and all wait for the
# one build). Offline-safe: a line that cannot be fetched or built is reported on stderr and left
# absent; the exit status is 0 when every requested line is there, 1 otherwise, and callers
# (tests) skip with the reason printed in build/containerd/<line>/FETCH-FAILED.
#
# Result per line: build/containerd/<line>/root/usr/bin/{containerd,containerd-shim-runc-v2,ctr}
# and build/containerd/<line>/VERSION (go lines: the build's output in build.log beside them).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
cache=$build/containerd
# shellcheck source=scripts/lib/lines.sh
. "$here/scripts/lib/lines.sh"
lines=("$@")
if [ ${#lines[@]} -eq 0 ]; then
  for line in $(gf_lines); do
    [ "$(gf_line_field "$line" source)" != system ] && [ "$(gf_line_field "$line" tests)" != - ] && lines+=("$line")
  done
fi

# The Debian suite a line's package comes from (source debian:SUITE).
suite_of() {
  local source
  source=$(gf_line_field "$1" source) || return 1
  [[ $source == debian:* ]] && echo "${source#debian:}"
}

# The release a Go-built line is pinned to (source go).
module_version_of() {
  [ "$(gf_line_field "$1" source)" = go ] && gf_line_field "$1" pin
}

# find_go, system_mirror, user_cache: shared with scripts/fetch-kubernetes.sh.
# shellcheck source=scripts/lib/fetch.sh
. "$here/scripts/lib/fetch.sh"

# go_build LINE DIR: containerd $(module_version_of LINE) from the module proxy into DIR/root.
go_build() {
  local line=$1 dir=$2 version go pkg=github.com/containerd/containerd/v2 ldflags log reported
  version=$(module_version_of "$line")
  if [ -x "$dir/root/usr/bin/containerd" ] && [ -x "$dir/root/usr/bin/containerd-shim-runc-v2" ] &&
    [ -x "$dir/root/usr/bin/ctr" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "${version#v}" ]; then
    return 0
  fi
  go=$(find_go) || { echo "$go"; return 1; }
  log=$dir/build.log
  rm -rf "$dir/root.tmp" && mkdir -p "$dir/root.tmp/usr/bin"
  local gocache gopath gomodcache goflags
  go_caches "$go"
  # As upstream's Makefile builds a release (VERSION, -s -w, urfave_cli_no_docs; the shim with
  # no_grpc), with cgo off: btrfs's snapshotter (the one cgo part, build tag `cgo`) is left out.
  ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Package=$pkg"
  local env=(env -u GOOS -u GOARCH -u GOFLAGS -u GOWORK CGO_ENABLED=0 GO111MODULE=on GOTOOLCHAIN=auto
    "GOFLAGS=$goflags" "GOCACHE=$gocache" "GOPATH=$gopath" "GOMODCACHE=$gomodcache"
    "GOBIN=$dir/root.tmp/usr/bin")
  {
    echo "# $(date -u +%FT%TZ) containerd $version with $go ($(GOTOOLCHAIN=local "$go" env GOVERSION)); GOCACHE=$gocache GOMODCACHE=$gomodcache"
    (cd "$dir" && "${env[@]}" "$go" install -tags urfave_cli_no_docs -ldflags "$ldflags" \
      "$pkg/cmd/containerd@$version" "$pkg/cmd/ctr@$version") &&
      (cd "$dir" && "${env[@]}" "$go" install -tags "urfave_cli_no_docs no_grpc" -ldflags "$ldflags" \
        "$pkg/cmd/containerd-shim-runc-v2@$version")
  } > "$log" 2>&1 || {
    echo "go install github.com/containerd/containerd/v2/cmd/...@$version failed: $(grep -v '^#' "$log" | tail -2 | tr '\n' ' ')(full output: $log)"
    rm -rf "$dir/root.tmp"
    return 1
  }
  reported=$("$dir/root.tmp/usr/bin/containerd" --version 2>&1 | awk '{print $3}')
  [ "$reported" = "$version" ] || { echo "the containerd built from $version says '$reported'"; return 1; }
  rm -rf "$dir/root" && mv "$dir/root.tmp" "$dir/root"
  echo "${version#v}" > "$dir/VERSION"
  rm -f "$dir/FETCH-FAILED"
}

# fetch LINE: prints nothing on success; the reason on failure (also kept in FETCH-FAILED).
fetch() {
  local line=$1 suite dir apt_dir deb mirror out
  if module_version_of "$line" >/dev/null; then
    dir=$cache/$line
    mkdir -p "$dir"
    exec 9>"$cache/.$line.lock"
    flock 9
    go_build "$line" "$dir"
    return
  fi
  suite=$(suite_of "$line") || { echo "containerd line '$line' is not fetched (its source in $gf_lines_table: $(gf_line_field "$line" source || echo none))"; return 1; }
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
    "$(gf_line_field "$line" pin)".*) ;;
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
