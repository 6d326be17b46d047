# Sourced by the get_*.sh scripts: fetch_file DEST URL TAG WHAT puts a good copy of a data file at
# DEST (under data/), taking the first source that has one: $CODAGPT_DATA/<name>, ../shared/data/<name>
# beside the repository (machines without internet access), then URL; <name> is DEST's file name.
# The caller defines `good FILE` (its size and checksum, or what it must hold); WHAT says how a copy
# fails it, in the error. Does nothing when DEST is already good. The copy goes through a temporary
# file beside DEST, renamed at the end: an interrupted download never leaves a partial file. TAG
# prefixes the messages; on failure it prints one error line and exits 1. One call a script (the
# temporary file and its clean-up trap are the script's).
fetch_file() {
  local dest=$1 url=$2 tag=$3 what=$4
  local name; name=$(basename "$dest")
  local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  good "$dest" && return 0
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp "$(dirname "$dest")/.$name.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  local failures="" src from=""
  for src in "${CODAGPT_DATA:+$CODAGPT_DATA/$name}" "$root/../shared/data/$name"; do
    [[ -n "$src" && -e "$src" ]] || continue
    if good "$src"; then
      cp "$src" "$tmp"
      from=$src
      break
    fi
    failures+="; $src $what"
  done
  if [[ -z "$from" ]]; then
    if ! command -v curl >/dev/null 2>&1 && ! command -v wget >/dev/null 2>&1; then
      failures+="; no curl or wget to download $url"
    elif ! _download "$url" 2>/dev/null; then
      failures+="; downloading $url failed"
    elif good "$tmp"; then
      from=$url
    else
      failures+="; the download from $url $what"
    fi
  fi
  if [[ -z "$from" ]]; then
    echo "$tag: error: no good copy of $name (looked in \$CODAGPT_DATA, ../shared/data and online${failures})" >&2
    exit 1
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$dest"
  echo "$tag: ${dest#"$root/"} from $from"
}

_download() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp" "$1"
  else
    wget -q --tries=3 --timeout=20 -O "$tmp" "$1"
  fi
}
