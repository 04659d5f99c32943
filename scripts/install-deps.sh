#!/usr/bin/env bash
# Installs every Debian 12 package the project needs. Idempotent: packages already present are
# skipped, so running it twice costs one dpkg query.
set -euo pipefail

packages=(
  cmake ninja-build ccache g++ pkg-config git python3 iproute2 procps
  systemd python3-jsonschema python3-yaml jq curl
  clang-14 libclang-rt-14-dev lld-14 clang-format clang-tidy
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  librocksdb-dev libssl-dev libsecp256k1-dev libabsl-dev libzstd-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev
  libgloo-dev python3-numpy
  libtorch-dev libopenblas0-openmp libsentencepiece-dev python3-torch fortunes
  prometheus-cpp-dev libcivetweb-dev prometheus chromium tcpdump
)
# The stats page's browser test and the compose schema come from the npm registry
# (tests/functional/web, tests/functional/compose_schema): Debian's Node.js unless one is there.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
echo "install-deps: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
