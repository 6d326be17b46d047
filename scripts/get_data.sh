#!/usr/bin/env bash
# Puts TinyShakespeare (the text llm.c's tinyshakespeare.py uses) at data/tinyshakespeare.txt, from
# the first source that has a good copy: $CODAGPT_DATA/tinyshakespeare.txt, then
# ../shared/data/tinyshakespeare.txt beside the repository (machines without internet access), then
# the public copy on GitHub. Every copy is checked by size and SHA-256. Does nothing when data/
# already holds the right file. Tokenizing is `codagpt prepare` (see `make data`).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest="$root/data/tinyshakespeare.txt"
url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
size=1115394
sha256=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1"; else shasum -a 256 "$1"; fi | cut -d' ' -f1
}
good() {  # good FILE: the expected size and checksum
  [[ -f "$1" && $(wc -c <"$1") -eq $size && $(sha256_of "$1") == "$sha256" ]]
}

if good "$dest"; then
  exit 0
fi

mkdir -p "$root/data"
# Fill a temporary file beside the destination and rename it: an interrupted download never
# leaves a partial data/tinyshakespeare.txt.
tmp=$(mktemp "$root/data/.tinyshakespeare.XXXXXX")
trap 'rm -f "$tmp"' EXIT
install_tmp() {
  chmod 644 "$tmp"
  mv "$tmp" "$dest"
  echo "get_data: data/tinyshakespeare.txt from $1"
  exit 0
}

failures=""
for src in "${CODAGPT_DATA:+$CODAGPT_DATA/tinyshakespeare.txt}" "$root/../shared/data/tinyshakespeare.txt"; do
  [[ -n "$src" && -e "$src" ]] || continue
  if good "$src"; then
    cp "$src" "$tmp"
    install_tmp "$src"
  fi
  failures+="; $src has the wrong size or checksum"
done

download() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp" "$url"
  else
    wget -q --tries=3 --timeout=20 -O "$tmp" "$url"
  fi
}
if ! command -v curl >/dev/null 2>&1 && ! command -v wget >/dev/null 2>&1; then
  failures+="; no curl or wget to download $url"
elif ! download 2>/dev/null; then
  failures+="; downloading $url failed"
elif good "$tmp"; then
  install_tmp "$url"
else
  failures+="; the download from $url has the wrong size or checksum"
fi

echo "get_data: error: no good copy of tinyshakespeare.txt (looked in \$CODAGPT_DATA, ../shared/data and online${failures})" >&2
exit 1
