#!/usr/bin/env bash
# Downloads, on a machine with Debian 12's apt sources, the Debian packages the worker needs to
# build on a GPU machine that has CUDA, PyTorch and CMake but none of them (scripts/gpu-check.sh
# unpacks them into a prefix there). They go to .gpu-debs/ in the repository root (ignored by
# git; about 20 MB), which a device run carries.
#
#   scripts/gpu-debs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-debs
mkdir -p "$out"
# The worker's build and run needs (docs/worker.md "A GPU machine's build"): Protobuf and gRPC
# with their compilers and libraries, Abseil, OpenSSL's headers, libsecp256k1 (the common
# library's keys), SentencePiece (the tokenizer's shim), CLI11 and nlohmann-json (headers), and
# pkg-config. The libraries they link that a CUDA image may lack or hold in another version
# (c-ares, RE2, the Abseil and Protobuf runtimes) come along; libc, libstdc++ and zlib's runtime
# are the machine's.
packages=(
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libgrpc++-dev libgrpc-dev libgrpc29 libgrpc++1.51 protobuf-compiler-grpc
  libabsl-dev libabsl20220623 libc-ares2 libc-ares-dev libre2-9 libre2-dev
  libssl-dev libssl3 zlib1g-dev
  libsecp256k1-dev libsecp256k1-1
  libsentencepiece-dev libsentencepiece0
  nlohmann-json3-dev libcli11-dev
  pkgconf pkgconf-bin libpkgconf3
)
(cd "$out" && rm -f ./*.deb && apt-get download "${packages[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
count=$(ls "$out"/*.deb | wc -l)
if [ "$count" -ne "${#packages[@]}" ]; then
  echo "gpu-debs: $count of ${#packages[@]} packages downloaded into $out" >&2
  exit 1
fi
du -sh "$out"
