#!/usr/bin/env bash
# build.sh: the foreign DRA driver of the cluster tier (main.go here), built with Go from the
# module proxy (its modules are mostly the ones scripts/fetch-kubernetes.sh fetched) into
# build/tools/foreign-dra/<hash of its sources>/, once per source change. `make test` runs it
# before the tests (the cluster's own namespace has no network); tests/cluster/dra.sh runs it
# again, which costs nothing when built. Prints the binary's path; on failure prints why and
# exits 1 (that step of dra.sh then skips, saying why).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$src/build}
cache=$build/tools/foreign-dra
key=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16)
out=$cache/$key/foreign-dra
[ -x "$out" ] && { echo "$out"; exit 0; }
# shellcheck source=scripts/lib/fetch.sh
. "$src/scripts/lib/fetch.sh"
go=$(find_go) || { echo "$go"; exit 1; }
go_caches "$go"
mkdir -p "$cache/$key"
exec 9>"$cache/.lock"
flock 9
[ -x "$out" ] && { echo "$out"; exit 0; }
(cd "$here" && env -u GOOS -u GOARCH -u GOWORK CGO_ENABLED=0 GOTOOLCHAIN=auto "GOCACHE=$gocache" \
  "GOPATH=$gopath" "GOMODCACHE=$gomodcache" "GOFLAGS=-mod=readonly $goflags" \
  "$go" build -trimpath -ldflags "-s -w" -o "$out.tmp" .) > "$cache/$key/build.log" 2>&1 ||
  { echo "building tests/cluster/foreign-dra failed: $(tail -2 "$cache/$key/build.log" | tr '\n' ' ')(full output: $cache/$key/build.log)"; exit 1; }
mv "$out.tmp" "$out" && echo "$out"
