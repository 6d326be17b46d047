#!/usr/bin/env bash
# Bad input on the command line: one clear error line naming the problem, and a non-zero exit.
# Usage: cli_errors.sh path/to/codagpt
set -u
bin=$1
fails=0
expect_error() {  # expect_error "what the message must contain" args...
  local want=$1; shift
  local out rc
  out=$("$bin" "$@" 2>&1); rc=$?
  local lines; lines=$(printf '%s\n' "$out" | grep -c .)
  if [[ $rc -eq 0 || "$out" != *"$want"* || $lines -ne 1 ]]; then
    echo "FAIL: codagpt $* -> exit $rc, $lines line(s): $out (wanted one line containing '$want')"
    fails=$((fails + 1))
  else
    echo "ok: codagpt $* -> $out"
  fi
}
expect_error "no_such_config" train --config no_such_config
expect_error "n_head" train --n_head 3
expect_error "n_layer" train --n_layer two
expect_error "bogus" train --set bogus=1
expect_error "--device" train --device tpu
expect_error "seq_len" train --seq_len 100000
expect_error "--input" prepare --out /tmp/x
expect_error "cannot open checkpoint /nonexistent/ckpt_5.bin" train --device cpu --resume /nonexistent/ckpt_5.bin
expect_error "not a codagpt checkpoint (bad magic)" train --device cpu --resume configs/gpt2-tiny.json
echo "$((9 - fails)) passed, $fails failed"
[[ $fails -eq 0 ]]
