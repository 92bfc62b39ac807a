#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU: the engine benchmark on CUDA and
# on wgpu, and the engine's training tests. The device machine has no network,
# so build here first and carry the binaries:
#   cargo build --release -p cohort-bench
#   cargo test --release -p cohort-engine --test training --no-run   # note the test binary path
# then run: scripts/gpu-check.sh [path/to/cohort-bench] [path/to/training-test-binary]
# A binary run away from the tree it was built in writes its figures under
# $COHORT_REPO_ROOT (this checkout) and stamps them with $COHORT_COMMIT when
# the copy has no git history.
# Figures land in docs/bench/engine-{cuda,wgpu}.json and docs/benchmarks.md,
# and, when $OUT is set, copies of them and the logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export COHORT_REPO_ROOT=$PWD
# Vulkan for wgpu: the NVIDIA driver's ICD where the loader finds none.
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=${VK_DRIVER_FILES:-$icd}
bench=${1:-target/release/cohort-bench}
tests=${2:-}
out=${OUT:-target/gpu-check}
mkdir -p "$out"
# Every check that fails is named at the end, and the script exits 1: a
# machine without a driver, a bench that falls back or crashes, a failing
# test all count.
failed=()
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt" \
  || failed+=("nvidia-smi")
arch=${ARCH:-"gpt l8 d512 h8 s256"}
# The bench fails without its PyTorch reference; where torch is missing the
# figures are published without it, and the table says so.
reference=torch
if ! python3 -c "import torch" 2>/dev/null; then
  echo "note: no PyTorch here; engine figures go out without the reference"
  reference=none
fi
# A cold machine compiles the CUDA kernels on first use: the first CUDA run
# took over 200 s there, a warm rerun 104 s.
for backend in cuda wgpu; do
  echo "== engine bench on $backend"
  limit=150
  [ "$backend" = cuda ] && limit=300
  timeout "$limit" "$bench" engine --backend "$backend" --arch "$arch" --batch 16 --steps 20 --reference "$reference" 2>&1 | tee "$out/engine-$backend.log" \
    || failed+=("engine bench on $backend")
done
if [ -n "$tests" ]; then
  echo "== training tests (wgpu member when an adapter exists)"
  timeout 100 "$tests" --test-threads 1 --nocapture 2>&1 | tee "$out/training.log" \
    || failed+=("training tests")
fi
cp docs/bench/engine-*.json docs/benchmarks.md "$out"/ 2>/dev/null || true
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "all GPU checks passed"
