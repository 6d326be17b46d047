#!/usr/bin/env bash
# Bad input on the command line: one clear error line naming the problem, and a non-zero exit.
# Usage: cli_errors.sh path/to/codagpt
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
total=0
expect_error() {  # expect_error "what the message must contain" args...
  local want=$1; shift
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  local lines; lines=$(printf '%s\n' "$out" | grep -c .)
  total=$((total + 1))
  if [[ $rc -eq 0 || "$out" != *"$want"* || $lines -ne 1 ]]; then
    echo "FAIL: codagpt $* -> exit $rc, $lines line(s): $out (wanted one line containing '$want')"
    fails=$((fails + 1))
  else
    echo "ok: codagpt $* -> $out"
  fi
}
le32() {  # an int32, little-endian
  local v=$1
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) $((v >> 16 & 255)) $((v >> 24 & 255)))"
}
# An llm.c model .bin (fp32 zeros) shaped like gpt2-tiny but 32 wide: the wrong shape for --init-from.
narrow=$tmp/narrow.bin
{
  for v in 20240326 3 64 50257 2 4 32 50304; do le32 $v; done
  head -c $((248 * 4)) /dev/zero
  # wte [50304, 32], wpe [64, 32], 2 blocks of 12 C^2 + 13 C, lnf 2 C
  head -c $(((50304 * 32 + 64 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32) * 4)) /dev/zero
} > "$narrow"

expect_error "no_such_config" train --config no_such_config
expect_error "n_head" train --n_head 3
expect_error "n_layer" train --n_layer two
expect_error "bogus" train --set bogus=1
expect_error "--device" train --device tpu
expect_error "--recompute" train --recompute everything
expect_error "--recompute-layers needs --recompute gelu or mlp" train --recompute-layers 1
expect_error "--recompute-layers must be between 1 and n_layer 2, got 3" train --recompute mlp --recompute-layers 3
expect_error "--lm-head-chunks: must be >= 0, got -2 (see --help)" train --lm-head-chunks -2
expect_error "--lm-head-chunks applies to the fused GPU path (--fusion coda), not the CPU reference" train --device cpu --lm-head-chunks 3
expect_error "--nondeterministic-attention applies to the GPU paths, not the CPU reference" train --device cpu --nondeterministic-attention
expect_error "seq_len" train --seq_len 100000
expect_error "--input" prepare --out /tmp/x
expect_error "cannot open checkpoint /nonexistent/ckpt_5.bin" train --device cpu --resume /nonexistent/ckpt_5.bin
expect_error "not a codagpt checkpoint (bad magic)" train --device cpu --resume configs/gpt2-tiny.json
expect_error "--stop-after: must be >= 0, got -1 (see --help)" train --stop-after -1
if "$bin" sample --help > /dev/null 2>&1; then  # builds with the tokenizer
  expect_error "--temperature: must be >= 0, got -0.5 (see --help)" sample --checkpoint x --temperature -0.5
  expect_error "--top-k: expected a number, got many" sample --checkpoint x --top-k many
  expect_error "--seed: must be >= 0, got -1" sample --checkpoint x --seed -1
  expect_error "--shard-tokens: must be >= 0, got -5" prepare --input configs/gpt2-tiny.json --out "$tmp/p" --shard-tokens -5
  expect_error "cannot open HellaSwag file /nonexistent/hs.jsonl" eval --device cpu --checkpoint "$narrow" --hellaswag_data /nonexistent/hs.jsonl
fi
expect_error "sample_every: must be >= 0" train --sample_every -1
expect_error "sample_every: expected an integer" train --sample_every often
expect_error "sample_tokens: must be >= 1" train --sample_tokens 0
expect_error "cannot open weights file /nonexistent/w.safetensors" train --device cpu --init-from /nonexistent/w.safetensors
expect_error "configs/gpt2-tiny.json: not a weights file" train --device cpu --init-from configs/gpt2-tiny.json
expect_error "n_embd 32 (config 64)" train --device cpu --init-from "$narrow"
expect_error "excludes" train --device cpu --init-from "$narrow" --resume latest
expect_error "--checkpoint is required" eval --device cpu
expect_error "cannot open weights file /nonexistent/w.bin" eval --device cpu --checkpoint /nonexistent/w.bin
expect_error "the options contradict the model of $narrow: n_embd 32 (config 64)" eval --device cpu --checkpoint "$narrow" --n_embd 64
expect_error "seq_len: must be <= max_seq_len (64), got 128" eval --device cpu --checkpoint "$narrow" --seq_len 128
# Files a run writes late are checked before its first step: a --bench-json that is not a JSON array
# is refused before the data loads (none here), folders that cannot be made before training starts.
expect_error "configs/gpt2-tiny.json: not a JSON array of benchmark records" train --device cpu \
  --train_data "$tmp/none_*.bin" --bench-json configs/gpt2-tiny.json
shard=$tmp/shard.bin  # 1,000 tokens (all 0) in llm.c's format
{ for v in 20240520 1 1000; do le32 $v; done; head -c $((253 * 4 + 1000 * 2)) /dev/zero; } > "$shard"
touch "$tmp/file"
expect_error "cannot create folder $tmp/file/run: Not a directory" train --device cpu --train_data "$shard" \
  --val_data "$shard" --out_dir "$tmp/file/run"
expect_error "cannot create folder $tmp/file: Not a directory" train --device cpu --train_data "$shard" \
  --val_data "$shard" --out_dir "$tmp/run" --bench-json "$tmp/file/bench.json"
[[ -e "$tmp/run/metrics.jsonl" ]] && { echo "FAIL: the refused run wrote $tmp/run/metrics.jsonl"; fails=$((fails + 1)); }
# A new run into a folder holding an earlier run's checkpoints is refused; the checkpoints are kept.
mkdir -p "$tmp/earlier" && echo "an earlier run's checkpoint" > "$tmp/earlier/ckpt_3.bin"
expect_error "out_dir $tmp/earlier holds the checkpoints of an earlier run (newest ckpt_3.bin)" train --device cpu \
  --train_data "$shard" --val_data "$shard" --out_dir "$tmp/earlier"
[[ "$(cat "$tmp/earlier/ckpt_3.bin")" == "an earlier run's checkpoint" && ! -e "$tmp/earlier/metrics.jsonl" ]] ||
  { echo "FAIL: the refused run touched $tmp/earlier"; fails=$((fails + 1)); }
# A run whose log cannot be written stops with the reason.
mkdir -p "$tmp/full_run" && ln -s /dev/full "$tmp/full_run/metrics.jsonl"
expect_error "cannot write metrics file $tmp/full_run/metrics.jsonl" train --device cpu -q --eval_every 0 --train_data "$shard" \
  --val_data "$shard" --out_dir "$tmp/full_run"
# An output over the file it is made from is refused, and that file kept.
cp "$narrow" "$tmp/weights.bin"
expect_error "refusing to write $tmp/./weights.bin: the same file as --checkpoint $tmp/weights.bin" export \
  --checkpoint "$tmp/weights.bin" --out "$tmp/./weights.bin"
cmp -s "$narrow" "$tmp/weights.bin" || { echo "FAIL: export changed its --checkpoint"; fails=$((fails + 1)); }
mkdir -p "$tmp/run_log" && echo '{"step": 1, "loss": 10.0}' > "$tmp/run_log/metrics.jsonl"
expect_error "refusing to write $tmp/run_log/metrics.jsonl: the same file as the run log" plot "$tmp/run_log" \
  -o "$tmp/run_log/metrics.jsonl"
expect_error "T 100 outside [1, 64]" export --checkpoint "$narrow" --out "$tmp/n.st" --reference-logits "$tmp/n.logits" \
  --reference-tokens 100
[[ -e "$tmp/n.st" ]] && { echo "FAIL: export wrote $tmp/n.st before refusing --reference-tokens"; fails=$((fails + 1)); }
# A result that cannot be written is a failure: eval's JSON into a full disk.
total=$((total + 1))
err=$("$bin" eval --device cpu --checkpoint "$narrow" --val_data "$shard" --json 2>&1 > /dev/full); rc=$?
if [[ $rc -eq 0 || "$err" != *"cannot write standard output"* ]]; then
  echo "FAIL: eval --json > /dev/full -> exit $rc: $err"; fails=$((fails + 1))
else
  echo "ok: eval --json > /dev/full -> $err"
fi
CODAGPT_DUMP=nodir expect_error "CODAGPT_DUMP must be DIR:LAYER[,LAYER...], got 'nodir'" train --device cpu
CODAGPT_DUMP=/nonexistent:3 expect_error "CODAGPT_DUMP: no directory /nonexistent" train --device cpu
echo "$((total - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
