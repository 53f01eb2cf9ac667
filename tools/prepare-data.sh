#!/usr/bin/env bash
# Prepares byte-level train/val token files from a real English corpus.
#   tools/prepare-data.sh [--text FILE] [--out DIR] [--passages RANGE] [--val-fraction F] [--bin DIR]
# Default corpus: the King James Bible from Debian's bible-kjv package (public domain, ~4.3 MB):
#   `bible gen1:1-rev22:21`. --passages picks another range (e.g. gen1:1-gen50:26 for Genesis).
#   --bin: where gpt2-data is (default: ${BUILD_DIR:-build}/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
text="" out="data/quickstart" passages="gen1:1-rev22:21" val_fraction=0.05 bin_dir=${BUILD_DIR:-build}/bin
while [[ $# -gt 0 ]]; do
  [[ $1 =~ ^--(text|out|passages|val-fraction|bin)$ && $# -lt 2 ]] && { echo "prepare-data: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --text) text="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --passages) passages="$2"; shift 2 ;;
    --val-fraction) val_fraction="$2"; shift 2 ;;
    --bin) bin_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "prepare-data: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bin=$bin_dir/gpt2-data
[[ -x "$bin" ]] || { echo "prepare-data: $bin not built (run tools/build.sh)" >&2; exit 1; }
mkdir -p "$out"
if [[ -z "$text" ]]; then
  command -v bible >/dev/null || { echo "prepare-data: 'bible' not found: run tools/install-deps.sh (package bible-kjv)" >&2; exit 1; }
  text="$out/corpus.txt"
  if [[ ! -s "$text" || ! -f "$out/.passages-$passages" ]]; then
    bible "$passages" > "$text.tmp"
    mv "$text.tmp" "$text"
    rm -f "$out"/.passages-*; touch "$out/.passages-$passages"
  fi
fi
[[ -r "$text" ]] || { echo "prepare-data: cannot read text file '$text'" >&2; exit 1; }
"$bin" prepare --tokenizer byte --text "$text" --out "$out" --val-fraction "$val_fraction"
