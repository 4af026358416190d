# shellcheck shell=bash
# Sourced by scripts/fetch-containerd.sh and scripts/fetch-kubernetes.sh: what both need to get a
# real component from a registry. Needs $cache (the script's cache dir under the build tree).
#   find_go         a Go >= 1.21 (GF_GO, PATH, /usr/local/go, else the pinned toolchain module)
#   system_mirror   the Debian mirror the system uses (GF_DEBIAN_MIRROR overrides)
#   go_caches       GOCACHE GOPATH GOMODCACHE GOFLAGS for a build: the user's, else under $cache

# The Go toolchain fetched when the machine has none: golang.org/toolchain on the module proxy,
# the module `go` itself downloads for GOTOOLCHAIN; the zip's SHA-256 is pinned here (taken from
# the zip whose h1: matched sum.golang.org's, 2026-12-07).
bootstrap_go=1.26.8
bootstrap_sha256=30c2b1bf7dcc88d3eb0a1364e47ddd9128edb3110a30e8a0ef61cd5856b31de7
if [ -n "${GF_CACHE_DIR:-}" ]; then user_cache=$GF_CACHE_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ]; then user_cache=$XDG_CACHE_HOME/gpufence
elif [ -n "${HOME:-}" ]; then user_cache=$HOME/.cache/gpufence
else user_cache=$cache/go-toolchain; fi

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

# find_go: prints a go command of version 1.21 or later (the first that can switch toolchains),
# fetching the pinned one when there is none; on failure prints why and returns 1.
find_go() {
  local g v dir zip proxy
  for g in "${GF_GO:-}" "$(command -v go 2>/dev/null)" /usr/local/go/bin/go; do
    [ -n "$g" ] && [ -x "$g" ] || continue
    v=$(GOTOOLCHAIN=local "$g" env GOVERSION 2>/dev/null) || continue
    v=${v#go}
    [ "$(printf '%s\n' 1.21 "$v" | sort -V | head -1)" = 1.21 ] && { echo "$g"; return 0; }
  done
  [ "$(uname -m)" = x86_64 ] || { echo "no Go >= 1.21 found (GF_GO, PATH, /usr/local/go) to build containerd"; return 1; }
  dir=$user_cache/go$bootstrap_go
  [ -x "$dir/bin/go" ] && { echo "$dir/bin/go"; return 0; }
  command -v unzip >/dev/null || { echo "no Go found, and unzip is not installed to unpack one"; return 1; }
  mkdir -p "$user_cache" || { echo "no Go found, and $user_cache cannot be made"; return 1; }
  exec 8>"$user_cache/.go$bootstrap_go.lock"  # one download at a time (lines build in parallel)
  flock 8
  [ -x "$dir/bin/go" ] && { echo "$dir/bin/go"; return 0; }
  proxy=${GOPROXY:-https://proxy.golang.org}
  proxy=${proxy%%[,|]*}
  case $proxy in http*) ;; *) proxy=https://proxy.golang.org ;; esac
  zip=$user_cache/go$bootstrap_go.zip.tmp
  if ! curl -fsSL --retry 2 -m 600 -o "$zip" \
      "$proxy/golang.org/toolchain/@v/v0.0.1-go$bootstrap_go.linux-amd64.zip" 2>"$zip.err"; then
    echo "no Go found, and fetching go$bootstrap_go from $proxy failed: $(tail -1 "$zip.err")"
    rm -f "$zip" "$zip.err"; return 1
  fi
  rm -f "$zip.err"
  if [ "$(sha256sum "$zip" | cut -d' ' -f1)" != "$bootstrap_sha256" ]; then
    echo "no Go found, and the go$bootstrap_go fetched from $proxy has the wrong SHA-256"
    rm -f "$zip"; return 1
  fi
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  unzip -q "$zip" -d "$dir.tmp" || { echo "cannot unzip $zip"; rm -rf "$zip" "$dir.tmp"; return 1; }
  rm -f "$zip"
  # Module zips carry no modes: the executables get theirs as `go` gives them (toolchain switch).
  chmod +x "$dir.tmp"/golang.org/toolchain@*/bin/* "$dir.tmp"/golang.org/toolchain@*/pkg/tool/*/* 2>/dev/null
  rm -rf "$dir" && mv "$dir.tmp"/golang.org/toolchain@* "$dir" && rm -rf "$dir.tmp"
  [ -x "$dir/bin/go" ] || { echo "the go$bootstrap_go toolchain unpacked with no bin/go"; return 1; }
  echo "$dir/bin/go"
}

# go_caches GO: sets gocache, gopath, gomodcache and goflags for a build with GO: the user's
# caches (go env), or under $cache when Go has none (no HOME), with -modcacherw so that removing
# the build tree needs no chmod.
go_caches() {
  local go=$1
  gocache=$(GOTOOLCHAIN=local "$go" env GOCACHE 2>/dev/null)
  gopath=$(GOTOOLCHAIN=local "$go" env GOPATH 2>/dev/null)
  gomodcache=$(GOTOOLCHAIN=local "$go" env GOMODCACHE 2>/dev/null)
  goflags=""
  case $gocache in /*) ;; *) gocache=$cache/go/build ;; esac
  [ -n "$gopath" ] || gopath=$cache/go  # also where sum.golang.org's answers are cached
  [ -n "$gomodcache" ] || { gomodcache=$cache/go/pkg/mod; goflags=-modcacherw; }
}
