#!/usr/bin/env bash
# Fuzzes every input-facing parser (tests/fuzz/fuzz_targets.hpp) with libFuzzer for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 30)] [TARGET...]
#   targets: config shard checkpoint weights tokenizer_files tokenizer_encode (default: all that build)
# Builds with clang, -fsanitize=fuzzer,address, in build-fuzz/. Seeds come from the kept corpus
# tests/fuzz/corpus/<target>/; new interesting inputs go to build-fuzz/corpus/<target>/ (not kept).
# A crash, sanitizer report, uncaught non-Error exception, multi-line error message or a hang
# (over 10 s) stops that target; its input is saved as tests/fuzz/corpus/<target>/crash-* so that
# test_bad_inputs replays it in every CI run once the parser is fixed. Exit status: 1 if any target failed.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(config shard checkpoint weights tokenizer_files tokenizer_encode)

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (apt-get install clang libclang-rt-dev)" >&2; exit 2; }
cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCODAGPT_FUZZ=ON -DCODAGPT_CUDA=OFF -DCODAGPT_BUILD_TESTS=OFF -DCODAGPT_NATIVE=OFF >/dev/null || exit 2
built=()
for t in "${targets[@]}"; do
  if cmake --build build-fuzz -j"${JOBS:-2}" --target "fuzz_$t" >build-fuzz/build_$t.log 2>&1; then
    built+=("$t")
  else
    echo "fuzz: cannot build fuzz_$t (see build-fuzz/build_$t.log)" >&2
    exit 2
  fi
done

failed=0
for t in "${built[@]}"; do
  work=build-fuzz/corpus/$t
  mkdir -p "$work"
  log=build-fuzz/fuzz_$t.log
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: a parser must not balloon.
  build-fuzz/tests/fuzz/fuzz_$t "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -max_len=65536 -artifact_prefix="tests/fuzz/corpus/$t/crash-" -print_final_stats=1 \
    >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  if [[ $rc -eq 0 ]]; then
    echo "fuzz: $t: ok, $runs inputs in ${seconds} s"
  else
    echo "fuzz: $t: FAILED (exit $rc), see $log; the input is in tests/fuzz/corpus/$t/crash-*"
    failed=1
  fi
done
exit $failed
