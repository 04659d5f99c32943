#!/usr/bin/env bash
# The worker on a GPU, checked on a fresh GPU machine that has CUDA, PyTorch (its libtorch) and
# CMake but no network and none of the Debian packages (docs/worker.md "A GPU machine's build",
# docs/benchmarks.md "GPU"). Before: scripts/gpu-debs.sh on a Debian machine, whose .gpu-debs/
# travels with the tree. Then, in the repository root on the GPU machine:
#
#   scripts/gpu-check.sh            # unpack, build the worker against torch's libtorch, measure
#   scripts/gpu-check.sh --cpu      # the same steps up to the GPU on a CPU machine (Debian's
#                                   # libtorch unless TS_TORCH_DIR says otherwise): a dry run
#
# Steps: the packages unpacked into a prefix; libtorch's CMake folder and C++ ABI read from the
# torch Python package; ts_worker, ts_worker_tool and ts_worker_shard_bench built (TS_WORKER_ONLY);
# then tests/bench/gpu_bench.py: throughput and MFU at bf16 for 125m, 350m and 1b against a
# matrix product's peak, PyTorch eager on the same GPU, a 4-worker DiLoCo shard sharing the GPU,
# and the tiny preset on GPU and CPU from the same seed. Everything goes to $OUT (default
# /tmp/gpu-check) as well: the log, the build's log and the bench's output with its JSON line.
# Meant to end within 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=gpu
if [ "${1:-}" = "--cpu" ]; then mode=cpu; fi
out="${OUT:-/tmp/gpu-check}"
mkdir -p "$out"
exec > >(tee -a "$out/gpu-check.log") 2>&1
log() { echo "[gpu-check +${SECONDS}s] $*"; }

# 1. The Debian packages, into a prefix of their own (never over the machine's /).
prefix="${TS_PREFIX:-/tmp/ts-prefix}"
debs=(.gpu-debs/*.deb)
if [ ! -e "${debs[0]}" ]; then
  echo "gpu-check: no .gpu-debs/*.deb here; run scripts/gpu-debs.sh on a Debian machine first" >&2
  exit 1
fi
mkdir -p "$prefix"
for deb in "${debs[@]}"; do
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$prefix"
  else
    tmp=$(mktemp -d)
    (cd "$tmp" && ar x "$OLDPWD/$deb" && tar -xf data.tar.* -C "$prefix")
    rm -rf "$tmp"
  fi
done
multiarch="$prefix/usr/lib/x86_64-linux-gnu"
export PATH="$prefix/usr/bin:$PATH"
export LD_LIBRARY_PATH="$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export PKG_CONFIG_LIBDIR="$multiarch/pkgconfig:$prefix/usr/share/pkgconfig"
log "unpacked ${#debs[@]} packages into $prefix"

# 2. libtorch: the torch Python package's, with its C++ ABI (the Debian libraries use the new one).
torch_dir="${TS_TORCH_DIR:-}"
if [ -z "$torch_dir" ] && [ "$mode" = gpu ]; then
  torch_dir=$(python3 -c 'import os, torch; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')
fi
if [ "$mode" = gpu ]; then
  python3 - <<'PY'
import sys, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU visible'}")
if not torch._C._GLIBCXX_USE_CXX11_ABI:
    sys.exit("gpu-check: this libtorch is built with the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0); "
             "the Debian libraries use the new one: a libtorch with the new ABI is needed")
if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no CUDA device")
PY
fi
log "libtorch: ${torch_dir:-the Debian package}"

# 3. The worker alone, against that libtorch and the prefix.
build="${TS_GPU_BUILD_DIR:-build-gpu}"
cmake_args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTS_WORKER_ONLY=ON -DTS_WERROR=OFF
            -DCMAKE_PREFIX_PATH="$prefix/usr" -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
            -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc"
            -DOPENSSL_ROOT_DIR="$prefix/usr")
if [ -n "$torch_dir" ]; then cmake_args+=(-DTS_TORCH_DIR="$torch_dir"); fi
if [ "$mode" = gpu ]; then cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES=native); fi
if ! cmake "${cmake_args[@]}" >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "gpu-check: cmake failed (the whole log: $out/build.log)" >&2
  exit 1
fi
grep -E '^-- libtorch' "$out/build.log" || true
if ! ninja -C "$build" ts_worker_main ts_worker_tool ts_worker_shard_bench >>"$out/build.log" 2>&1; then
  grep -E 'error|Error' "$out/build.log" | head -30
  echo "gpu-check: the build failed (the whole log: $out/build.log)" >&2
  exit 1
fi
log "built ts_worker, ts_worker_tool and ts_worker_shard_bench in $build"

# 4. The figures.
if [ "$mode" = cpu ]; then
  "$build/worker/ts_worker" --probe-device --device auto
  "$build/worker/ts_worker_tool" matmul --device cpu --dtype fp32 --n 512 --repeats 3
  "$build/worker/ts_worker_shard_bench" --worker "$build/worker/ts_worker" --device cpu \
      --preset tiny --vocab 512 --context 32 --batch 4 --steps 10 --rounds 2 --threads 1
  log "dry run done: every step up to the GPU works"
  exit 0
fi
"$build/worker/ts_worker" --probe-device --device cuda
PYTHONUNBUFFERED=1 python3 tests/bench/gpu_bench.py --build-dir "$build" | tee "$out/gpu-bench.out"
log "done"
