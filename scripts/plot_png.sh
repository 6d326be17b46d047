#!/usr/bin/env bash
# `codagpt plot` as a PNG (slides, issue comments), through ImageMagick's convert:
#   bash scripts/plot_png.sh RUN_DIR [RUN_DIR ...] -o FILE.png [--labels a,b,...]
# Every argument but -o goes to `codagpt plot` unchanged. CODAGPT names the binary (default
# build/codagpt in this checkout).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${CODAGPT:-$root/build/codagpt}
args=() png=
while (($#)); do
  case $1 in
    -o|--out) png=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ -n $png ]] || { echo "plot_png: usage: plot_png.sh RUN_DIR [RUN_DIR ...] -o FILE.png [--labels a,b,...]" >&2; exit 2; }
command -v convert >/dev/null || { echo "plot_png: ImageMagick's convert is not installed (apt-get install imagemagick), or use codagpt plot for an SVG" >&2; exit 1; }
[[ -x $bin ]] || { echo "plot_png: no codagpt binary at $bin (build it, or set CODAGPT)" >&2; exit 1; }

svg=$(mktemp --suffix=.svg)
trap 'rm -f "$svg"' EXIT
"$bin" plot "${args[@]}" -o "$svg" >/dev/null
# At the SVG's own size (900x700): ImageMagick's built-in SVG renderer closes polylines into
# polygons when asked for another -density.
convert "$svg" "$png" || { echo "plot_png: convert could not render the SVG (its SVG support needs fonts: apt-get install gsfonts)" >&2; exit 1; }
echo "wrote $png"
