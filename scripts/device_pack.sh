#!/usr/bin/env bash
# Builds, on this machine, what a GPU machine without a package manager needs, into one folder
# (default .carry/dev, git-ignored): the codagpt binary, GPU test binaries, bench_gemm, bench_step_energy, bench_wgmma and bench_attention built for Hopper
# (sm_90a) without -march=native and without the tokenizer (ICU), the prepared TinyShakespeare
# shards, the configs, and the PyTorch peer benchmark. Run scripts/gpu_check.sh there with that folder.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.carry/dev}
build=.carry/build-dev
archs=${CODAGPT_DEVICE_ARCHS:-90a}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCODAGPT_NATIVE=OFF -DCODAGPT_TOKENIZER=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="$archs" >/dev/null
cmake --build "$build" -j"$(nproc)"
cmake --build "$build" -j"$(nproc)" --target bench_gemm bench_step_energy bench_wgmma bench_attention
rm -rf "$out" && mkdir -p "$out/data"
cp "$build/codagpt" "$out/"
cp -r configs "$out/"  # the configs this binary knows: the working tree's may have moved on
# OpenMP runtime of the GEMM test's fp64 references (the GPU machine may lack it)
cp "$(gcc -print-file-name=libgomp.so.1)" "$out/" 2>/dev/null || true
find "$build/tests" -maxdepth 1 -name "test_gpu_*" -type f -executable -exec cp {} "$out/" \;
cp "$build/bench/bench_gemm" "$build/bench/bench_step_energy" "$build/bench/bench_wgmma" "$build/bench/bench_attention" "$out/"
[[ -f data/tinyshakespeare/val_000000.bin ]] || make data
cp data/tinyshakespeare/*.bin "$out/data/"
for peer in "${CODAGPT_SHARED:-../shared}/bench/torch_gpt2.py"; do
  [[ -f "$peer" ]] && cp "$peer" "$out/"
done
du -sh "$out"
