#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The screening codecs at their defaults on every shipped dictionary (all N = 128): the pool
# n defaults to N / 16, at least s (8 here), resolved by the sweep from the dictionary, so
# gm, pl and fadkv run where n = 256 used to exceed N; the resolved value is the cell's (its
# cells.csv column and resolved.txt line). Only n_b is set (the embedded traces are shorter
# than the default buffer of 128 tokens).   usage: test_defaults.sh BIN  (FK_SRCDIR)
set -euo pipefail
bin=$1
src=${FK_SRCDIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
{
    printf '[sweep]\nname = "defaults"\noutput = "%s/res"\nattention = false\nrecall = false\n' "$tmp"
    printf '[defaults]\nn_b = 16\n'
    for d in aidreams-260k babyllama-tok105 fortune-byte-4L fortune-hd128; do
        printf '[[dataset]]\nname = "%s"\ntraces = ["%s/datasets/embedded/%s-00.h5"]\n' "$d" "$src" "$d"
        printf 'dictionary = "%s/datasets/dicts/%s.h5"\n' "$src" "$d"
    done
    for c in gm pl fadkv; do printf '[[codec]]\nname = "%s"\n' "$c"; done
} > "$tmp/sweep.toml"
"$bin" --config "$tmp/sweep.toml" --dry-run > "$tmp/dry.txt" || fail "the dry run refused the defaults"
"$bin" --config "$tmp/sweep.toml" --quiet > "$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt" >&2; fail "the sweep failed"; }
csv=$tmp/res/cells.csv
[ -f "$csv" ] || { echo "FAIL: no cells.csv" >&2; exit 1; }
col() { head -1 "$csv" | tr ',' '\n' | grep -nx "$1" | cut -d: -f1; }
st=$(col status) n=$(col n) s=$(col s)
rows=$(tail -n +2 "$csv" | wc -l)
[ "$rows" = 12 ] || fail "$rows cells, expected 12 (3 codecs x 4 dictionaries)"
ok=$(tail -n +2 "$csv" | awk -F, -v c="$st" '$c == "ok"' | wc -l)
[ "$ok" = 12 ] || fail "$ok of 12 cells ok: $(tail -n +2 "$csv" | awk -F, -v c="$st" '$c != "ok" {print $2, $3, $c}')"
bad=$(tail -n +2 "$csv" | awk -F, -v n="$n" -v s="$s" '$n != 8 || $s != 8' | wc -l)
[ "$bad" = 0 ] || fail "$bad cells without n = 8 = max(s, N/16) and s = 8"
grep -q "codec=fadkv;.*;n=8;" "$tmp/res/resolved.txt" || fail "resolved.txt does not carry the resolved n = 8"
# progress into a file (not a terminal), two cells side by side: every cell's end line
# carries its label, unless it directly follows the cell's own start line
"$bin" --config "$tmp/sweep.toml" --set "sweep.output=\"$tmp/res2\"" --jobs 2 > "$tmp/progress.txt" 2>&1 ||
    fail "the second sweep failed"
ends=$(grep -c 'vec/s, rel_err' "$tmp/progress.txt" || true)
[ "$ends" = 12 ] || fail "$ends end lines, expected 12"
orphans=$(awk '/vec\/s, rel_err/ && !/^\[/ { if (prev !~ /^\[[0-9]+\/[0-9]+\]/ || prev ~ /vec\/s/) n++ }
               { prev = $0 } END { print n + 0 }' "$tmp/progress.txt")
[ "$orphans" = 0 ] || { cat "$tmp/progress.txt" >&2; fail "$orphans end line(s) without their cell's label"; }
echo "$ok of $rows cells ok at the defaults, n resolved to 8 (N = 128); progress labelled"
[ "$fails" = 0 ] || exit 1
echo PASS
