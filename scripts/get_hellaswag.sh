#!/usr/bin/env bash
# Puts HellaSwag's validation set (github.com/rowanz/hellaswag, MIT license) at
# data/hellaswag/hellaswag_val.jsonl, for the config key hellaswag_data, from the first source that has
# a good copy: $CODAGPT_DATA/hellaswag_val.jsonl, then ../shared/data/hellaswag_val.jsonl beside the
# repository, then the public copy on GitHub. A copy is good when it holds the set's 10,042 items,
# one JSON object with "ctx", "label" and "endings" a line. Does nothing when data/ already holds one.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
items=10042

good() {  # good FILE: every line an item, and the set's count of them (a last line without a newline too)
  [[ -f "$1" && $(grep -c '' "$1") -eq $items && $(grep -c '"ctx": .*"label": .*"endings": \[' "$1") -eq $items ]]
}

source "$root/scripts/fetch_file.sh"
fetch_file "$root/data/hellaswag/hellaswag_val.jsonl" \
  https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl get_hellaswag \
  "does not hold the $items items"
