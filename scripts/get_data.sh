#!/usr/bin/env bash
# Puts TinyShakespeare (the text llm.c's tinyshakespeare.py uses) at data/tinyshakespeare.txt, from
# the first source that has a good copy: $CODAGPT_DATA/tinyshakespeare.txt, then
# ../shared/data/tinyshakespeare.txt beside the repository (machines without internet access), then
# the public copy on GitHub. Every copy is checked by size and SHA-256. Does nothing when data/
# already holds the right file. Tokenizing is `codagpt prepare` (see `make data`).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
size=1115394
sha256=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1"; else shasum -a 256 "$1"; fi | cut -d' ' -f1
}
good() {  # good FILE: the expected size and checksum
  [[ -f "$1" && $(wc -c <"$1") -eq $size && $(sha256_of "$1") == "$sha256" ]]
}

source "$root/scripts/fetch_file.sh"
fetch_file "$root/data/tinyshakespeare.txt" \
  https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt get_data \
  "has the wrong size or checksum"
