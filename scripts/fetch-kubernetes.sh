#!/usr/bin/env bash
# fetch-kubernetes.sh: the real Kubernetes the cluster tests run (tests/cluster/, docs/testing.md),
# built from the Go module proxy under the build tree:
#   kubelet, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl   k8s.io/kubernetes
#   etcd                                    go.etcd.io/etcd/server/v3 (the release Kubernetes pins)
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
# replaces them with directories of its own source tree, so it cannot be `go install`ed by path.
# This script writes a small module that requires it at the pinned version and replaces each
# module of its `replace` block with the published v0.MINOR.PATCH, then builds the commands as
# upstream's release does (CGO_ENABLED=0, -s -w, the version stamped by ldflags so `kubelet
# --version` and the API server's /version say it). etcd's command is a four-line main calling
# the etcdmain package of the etcd server release Kubernetes' own go.mod requires (v3.6.8 for
# v1.36.3), so adding it moves no module Kubernetes builds with.
#
# Idempotent and cached: the binaries under build/kubernetes/<version>/bin are kept while VERSION
# says the pinned one; Go's module and build caches are the user's (`go env`), so a new build tree
# only relinks (seconds) while a cold machine compiles for ~20 minutes on 2 cores
# (docs/testing.md). One fetch at a time (flock). Offline-safe: a failure is reported on stderr and
# in build/kubernetes/FETCH-FAILED, the exit status is 1 and the cluster tests skip, saying why.
# Prints the bin directory on success.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
cache=$build/kubernetes
# The release built: Kubernetes 1.36 (the line whose kubelet supports containerd 2.2+ and still
# runs on 1.7), its staging modules at the matching v0.36 release.
k8s_version=v1.36.3
staging_version=v0.36.3
dir=$cache/$k8s_version
commands=(kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl)
# shellcheck source=scripts/lib/fetch.sh
. "$here/scripts/lib/fetch.sh"

# write_module DIR GO: the build module (go.mod with the replaces, etcd's main) in DIR.
write_module() {
  local src=$1 go=$2 upstream_mod
  mkdir -p "$src/cmd/etcd"
  # The upstream go.mod from the module cache (downloaded through the proxy when absent).
  upstream_mod=$(cd "$src" && GOFLAGS=-mod=mod "$go" mod download -json "k8s.io/kubernetes@$k8s_version" 2>&1 |
    sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p') || return 1
  [ -f "$upstream_mod" ] || { echo "go mod download k8s.io/kubernetes@$k8s_version gave no go.mod"; return 1; }
  {
    printf 'module gpufence.test/kubernetes-build\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$k8s_version"
    sed -n '/^replace (/,/^)/p' "$upstream_mod" | awk -v v="$staging_version" '$2 == "=>" && $3 ~ /^\.\// {print "\t" $1 " => " $1 " " v}'
    printf ')\n'
  } > "$src/go.mod"
  grep -q 'k8s.io/client-go => k8s.io/client-go' "$src/go.mod" || { echo "k8s.io/kubernetes@$k8s_version has no replace block this script knows"; return 1; }
  # etcd: the server release Kubernetes itself requires (its go.mod), so nothing it builds with moves.
  etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$upstream_mod")
  [ -n "$etcd_version" ] || { echo "k8s.io/kubernetes@$k8s_version's go.mod names no etcd server release"; return 1; }
  cat > "$src/cmd/etcd/main.go" <<'GO'
// etcd, as upstream's own main: the server's etcdmain with the command line.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
}

build_all() {
  local go src log minor ldflags c pkg etcd_version
  go=$(find_go) || { echo "$go"; return 1; }
  local gocache gopath gomodcache goflags
  go_caches "$go"
  src=$dir/src log=$dir/build.log
  rm -rf "$src" "$dir/bin.tmp" && mkdir -p "$src" "$dir/bin.tmp"
  local env=(env -u GOOS -u GOARCH -u GOFLAGS -u GOWORK CGO_ENABLED=0 GO111MODULE=on GOTOOLCHAIN=auto
    "GOCACHE=$gocache" "GOPATH=$gopath" "GOMODCACHE=$gomodcache")
  export GOCACHE=$gocache GOPATH=$gopath GOMODCACHE=$gomodcache
  write_module "$src" "$go" || return 1
  minor=${k8s_version#v1.}
  minor=${minor%%.*}
  # hack/lib/version.sh's ldflags, for component-base (servers) and client-go (kubectl's client).
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  {
    echo "# $(date -u +%FT%TZ) kubernetes $k8s_version (staging $staging_version) with $go ($(GOTOOLCHAIN=local "$go" env GOVERSION)); GOCACHE=$gocache GOMODCACHE=$gomodcache"
    (cd "$src" && "${env[@]}" "GOFLAGS=-mod=mod $goflags" "$go" get "k8s.io/kubernetes@$k8s_version" \
      "go.etcd.io/etcd/server/v3/etcdmain@$etcd_version") &&
      for c in "${commands[@]}"; do
        echo "# $c"
        (cd "$src" && "${env[@]}" "GOFLAGS=-mod=mod $goflags" "$go" build -trimpath -ldflags "$ldflags" \
          -o "$dir/bin.tmp/$c" "k8s.io/kubernetes/cmd/$c") || exit 1
      done &&
      (cd "$src" && "${env[@]}" "GOFLAGS=-mod=mod $goflags" "$go" build -trimpath -ldflags "-s -w" -o "$dir/bin.tmp/etcd" ./cmd/etcd)
  } > "$log" 2>&1 || {
    echo "building kubernetes $k8s_version from the Go module proxy failed: $(grep -v '^#' "$log" | tail -2 | tr '\n' ' ')(full output: $log)"
    return 1
  }
  local reported
  reported=$("$dir/bin.tmp/kubelet" --version 2>&1 | awk '{print $2}')
  [ "$reported" = "$k8s_version" ] || { echo "the kubelet built from $k8s_version says '$reported'"; return 1; }
  "$dir/bin.tmp/etcd" --version > "$dir/bin.tmp/etcd.version" 2>&1 || { echo "the etcd built does not run: $(head -1 "$dir/bin.tmp/etcd.version")"; return 1; }
  grep -q "^etcd Version: ${etcd_version#v}\$" "$dir/bin.tmp/etcd.version" || { echo "the etcd built from $etcd_version says '$(head -1 "$dir/bin.tmp/etcd.version")'"; return 1; }
  rm -rf "$dir/bin" && mv "$dir/bin.tmp" "$dir/bin"
  echo "$k8s_version" > "$dir/VERSION"
}

fetch() {
  local c
  for c in "${commands[@]}" etcd; do [ -x "$dir/bin/$c" ] || break; done
  [ -x "$dir/bin/$c" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$k8s_version" ] && return 0
  build_all
}

mkdir -p "$dir"
exec 9>"$cache/.lock"
flock 9
if why=$(fetch); then
  rm -f "$cache/FETCH-FAILED"
  echo "$dir/bin"
  exit 0
fi
echo "$why" > "$cache/FETCH-FAILED"
echo "fetch-kubernetes: kubernetes $k8s_version not available: $why" >&2
exit 1
