#!/usr/bin/env bash
# fetch-promtool.sh: promtool, Prometheus's rule checker and rule unit-test runner, for the chart's
# monitoring tests (tests/scenario/monitoring.sh, docs/monitoring.md), built from the Go module
# proxy under the build tree:
#   go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0   (Prometheus 3.16.0)
# with CGO_ENABLED=0 and the version stamped as upstream's release does, so `promtool --version`
# says it (checked). The Go used is scripts/lib/fetch.sh's find_go: $GF_GO, PATH, /usr/local/go,
# else the pinned toolchain module.
#
# Idempotent and cached: build/tools/promtool/<version>/promtool is kept while VERSION there says
# the pinned version; Go's module and build caches are the user's (`go env`), so a new build tree
# only relinks (seconds) while a cold machine compiles for about 3 minutes on 2 cores
# (docs/testing.md). One fetch at a time (flock). $PROMTOOL, when it names an executable, is used
# instead. Prints the binary's path; when none can be had, prints why on stderr and in
# build/tools/promtool/FETCH-FAILED and exits 77, so the tests that need it skip, saying why.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${GPUFENCE_BUILD_DIR:-$here/build}
cache=$build/tools/promtool
module=github.com/prometheus/prometheus
version=v0.316.0
# Prometheus 3.x tags its Go module v0.3MM.P for release 3.MM.P.
minor=${version#v0.3}
release=3.$((10#${minor%%.*})).${version##*.}
dir=$cache/$version
# shellcheck source=scripts/lib/fetch.sh
. "$here/scripts/lib/fetch.sh"

if [ -n "${PROMTOOL:-}" ] && [ -x "$PROMTOOL" ]; then echo "$PROMTOOL"; exit 0; fi

build_promtool() {
  local go log gocache gopath gomodcache goflags reported ldflags v
  go=$(find_go) || { echo "$go"; return 1; }
  go_caches "$go"
  log=$dir/build.log
  rm -rf "$dir/bin.tmp" && mkdir -p "$dir/bin.tmp"
  ldflags="-s -w"
  for v in "Version=$release" "Revision=$version" "Branch=HEAD" "BuildUser=gpufence" "BuildDate=19700101-00:00:00"; do
    ldflags+=" -X github.com/prometheus/common/version.$v"
  done
  {
    echo "# $(date -u +%FT%TZ) promtool $version (Prometheus $release) with $go ($(GOTOOLCHAIN=local "$go" env GOVERSION)); GOCACHE=$gocache GOMODCACHE=$gomodcache"
    # From an empty directory: no go.mod or go.work of anyone's is in play.
    cd "$dir/bin.tmp" && env -u GOOS -u GOARCH -u GOFLAGS -u GOWORK CGO_ENABLED=0 GO111MODULE=on \
      GOTOOLCHAIN=auto "GOCACHE=$gocache" "GOPATH=$gopath" "GOMODCACHE=$gomodcache" \
      "GOFLAGS=$goflags" "GOBIN=$dir/bin.tmp" \
      "$go" install -ldflags "$ldflags" "$module/cmd/promtool@$version"
  } > "$log" 2>&1 || {
    echo "building promtool $version from the Go module proxy failed: $(grep -v '^#' "$log" | tail -2 | tr '\n' ' ')(full output: $log)"
    return 1
  }
  reported=$("$dir/bin.tmp/promtool" --version 2>&1 | awk 'NR == 1 {print $3}')
  [ "$reported" = "$release" ] || { echo "the promtool built from $version says version '$reported', not $release"; return 1; }
  mv -f "$dir/bin.tmp/promtool" "$dir/promtool" && rm -rf "$dir/bin.tmp"
  echo "$version" > "$dir/VERSION"
}

mkdir -p "$dir" || { echo "fetch-promtool: cannot make $dir" >&2; exit 77; }
exec 9>"$cache/.lock"
flock 9
if [ -x "$dir/promtool" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ]; then
  echo "$dir/promtool"
  exit 0
fi
if why=$(build_promtool); then
  rm -f "$cache/FETCH-FAILED"
  echo "$dir/promtool"
  exit 0
fi
echo "$why" > "$cache/FETCH-FAILED"
echo "fetch-promtool: promtool $version not available: $why" >&2
exit 77
