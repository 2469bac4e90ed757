#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Compares two results directories cell for cell, timing figures aside: the tables
# (cells.csv, summary.csv), every cell's .meta and .summary.csv, every cell HDF5 file
# (h5diff, exact) and resolved.txt. Used to show that a refactor keeps every number:
#   tools/compare_results.sh results-before/default results-after/default
# With --allow-new, columns and .meta keys that only side B has (a change that adds a
# metric) are listed as notes; every value both sides have must still be identical.
# A directory's own path inside its files (a closed loop's traces live under the output
# directory) is read as "<results>", so two runs into different directories compare.
# Prints one line per difference and a verdict; exit 0 identical, 1 different, 2 usage.
set -uo pipefail
allow_new=0
[ "${1:-}" = --allow-new ] && { allow_new=1; shift; }
[ $# -eq 2 ] && [ -d "$1" ] && [ -d "$2" ] || {
    echo "usage: $0 [--allow-new] RESULTS_DIR_A RESULTS_DIR_B" >&2; exit 2; }
a=$1 b=$2
abs_a=$(cd "$a" && pwd -P) abs_b=$(cd "$b" && pwd -P)
# FILE's text with side S's own directory written "<results>" (S: a or b).
unpath() {  # S [FILE]
    local d=$a abs=$abs_a
    [ "$1" = b ] && { d=$b; abs=$abs_b; }
    sed -e "s|$abs/|<results>/|g" -e "s|${d%/}/|<results>/|g" ${2:+"$2"}
}
# Columns and meta keys that are measured time (differ run to run by nature), and the
# checksums of a cell's files (its summary rows hold cpu_s; the files are compared below).
timing="wall_s cpu_us_per_vec cpu_time_rel cpu_s t_corr t_code t_adapt t_io t_encode t_attn t_metrics t_gram t_policy file.h5 file.summary.csv"
diffs=0
say() { echo "$*"; diffs=$((diffs + 1)); }

# A CSV projected on the columns COLS (space-separated names), timing columns dropped, rows
# sorted. Its header is its first line, or HEADER (the per-cell summaries hold the rows of
# summary.csv without its header line).
norm_csv() {  # FILE COLS [HEADER]: the columns COLS, in COLS's order (timing aside)
    { [ -z "${3:-}" ] || echo "$3"; cat "$1"; } | awk -F, -v want="$2" -v timing=" $timing " '
        NR == 1 { n = split(want, w, " "); for (i = 1; i <= NF; i++) at[$i] = i
                  k = 0; for (j = 1; j <= n; j++)
                      if ((w[j] in at) && !index(timing, " " w[j] " ")) col[++k] = at[w[j]] }
        { line = ""; for (j = 1; j <= k; j++) line = line (j > 1 ? "," : "") $col[j]
          print line }' | { IFS= read -r h; echo "$h"; LC_ALL=C sort; }
}
# Names of the columns of FILE (or HEADER), one per line.
columns() { { [ -z "${2:-}" ] || echo "$2"; head -n 1 "$1"; } | head -n 1 | tr ',' '\n'; }
# 1 if column COL of FILE (or HEADER) holds a value in some row.
column_used() {  # FILE COL [HEADER]
    { [ -z "${3:-}" ] || echo "$3"; cat "$1"; } | awk -F, -v col="$2" '
        NR == 1 { for (i = 1; i <= NF; i++) if ($i == col) c = i; next }
        c && $c != "" { used = 1 } END { print used ? 1 : 0 }'
}
# Two CSVs compared on their common columns, whatever their order. A column only one side
# has (a codec added to the registry brings a new option column) is a difference only where
# it holds a value. HEADER_A and HEADER_B: the headers of header-less files (the per-cell
# summaries carry the rows of their own side's summary.csv).
cmp_csv() {  # NAME FILE_A FILE_B [HEADER_A [HEADER_B]]
    if [ ! -f "$2" ] || [ ! -f "$3" ]; then
        [ -f "$2" ] || [ -f "$3" ] && say "$1: present on one side only"; return; fi
    local out ca cb common col side f ha=${4:-} hb=${5:-${4:-}}
    ca=$(columns "$2" "$ha"); cb=$(columns "$3" "$hb")
    common=$(grep -Fxf <(echo "$cb") <<<"$ca" | tr '\n' ' ')
    for side in a b; do
        if [ $side = a ]; then f=$2; h=$ha; else f=$3; h=$hb; fi
        for col in $(if [ $side = a ]; then grep -vFxf <(echo "$cb") <<<"$ca";
                     else grep -vFxf <(echo "$ca") <<<"$cb"; fi); do
            if [ "$(column_used "$f" "$col" "$h")" = 1 ] && [ $side$allow_new != b1 ]; then
                say "$1: column '$col' only in side $side, with values"
            elif [ -z "${seen_col[$col]:-}" ]; then
                what="empty in every row"
                [ "$(column_used "$f" "$col" "$h")" = 0 ] || what="new, allowed by --allow-new"
                echo "note: $1: column '$col' only in side $side ($what)"
                seen_col[$col]=1
            fi
        done
    done
    out=$(diff <(norm_csv "$2" "$common" "$ha" | unpath a) \
               <(norm_csv "$3" "$common" "$hb" | unpath b) | head -n 6)
    [ -z "$out" ] || { say "$1 differs:"; echo "$out" | sed 's/^/    /'; }
}
declare -A seen_col=()
norm_meta() { awk -F'\t' -v timing=" $timing " 'index(timing, " " $1 " ") == 0' "$1" | LC_ALL=C sort; }
# .meta of side B restricted to the keys of side A's (FILE_B FILE_A), with --allow-new.
meta_b() {
    if [ $allow_new = 0 ]; then norm_meta "$1"; return; fi
    local extra
    extra=$(awk -F'\t' 'NR == FNR { k[$1] = 1; next } !($1 in k) { print $1 }' "$2" "$1" | tr '\n' ' ')
    # (runs in a process substitution: the note goes to stderr, once, through a flag file)
    [ -z "$extra" ] || [ -e "$tmpd/noted" ] || {
        echo "note: .meta keys only in side b: $extra" >&2; : > "$tmpd/noted"; }
    awk -F'\t' 'NR == FNR { k[$1] = 1; next } $1 in k' "$2" "$1" > "$tmpd/meta"
    norm_meta "$tmpd/meta"
}
tmpd=$(mktemp -d); trap 'rm -rf "$tmpd"' EXIT

cmp_csv cells.csv "$a/cells.csv" "$b/cells.csv"
cmp_csv summary.csv "$a/summary.csv" "$b/summary.csv"
if [ -f "$a/resolved.txt" ] || [ -f "$b/resolved.txt" ]; then
    cmp -s "$a/resolved.txt" "$b/resolved.txt" || say "resolved.txt differs"
fi
ids_a=$(cd "$a/cells" 2>/dev/null && ls *.meta 2>/dev/null | sed 's/\.meta$//' | sort)
ids_b=$(cd "$b/cells" 2>/dev/null && ls *.meta 2>/dev/null | sed 's/\.meta$//' | sort)
[ "$ids_a" = "$ids_b" ] || say "the cell sets differ: $(comm -3 <(echo "$ids_a") <(echo "$ids_b") | tr -s ' \t\n' ' ')"
sum_header_a=$(head -n 1 "$a/summary.csv" 2>/dev/null)
sum_header_b=$(head -n 1 "$b/summary.csv" 2>/dev/null)
n=0
for id in $(comm -12 <(echo "$ids_a") <(echo "$ids_b")); do
    n=$((n + 1))
    out=$(diff <(norm_meta "$a/cells/$id.meta" | unpath a) \
               <(meta_b "$b/cells/$id.meta" "$a/cells/$id.meta" | unpath b) | head -n 4)
    [ -z "$out" ] || { say "cell $id: .meta differs:"; echo "$out" | sed 's/^/    /'; }
    cmp_csv "cell $id .summary.csv" "$a/cells/$id.summary.csv" "$b/cells/$id.summary.csv" \
        "$sum_header_a" "$sum_header_b"
    if [ -f "$a/cells/$id.h5" ] || [ -f "$b/cells/$id.h5" ]; then
        out=$(h5diff -c "$a/cells/$id.h5" "$b/cells/$id.h5" 2>&1 | head -n 6)
        rc=${PIPESTATUS[0]}
        # h5diff compares attributes as bytes: where it finds a difference, the two dumps
        # (every float to 17 digits) are compared with each side's directory unpathed.
        if [ "$rc" != 0 ]; then
            out=$(diff <(h5dump -m %.17g "$a/cells/$id.h5" 2>&1 | tail -n +2 | unpath a) \
                       <(h5dump -m %.17g "$b/cells/$id.h5" 2>&1 | tail -n +2 | unpath b) | head -n 6)
            [ -n "$out" ] || rc=0
        fi
        [ "$rc" = 0 ] || { say "cell $id: HDF5 differs:"; echo "$out" | sed 's/^/    /'; }
    fi
done
if [ "$diffs" = 0 ]; then
    echo "identical: $n cells (tables, meta, per-cell summaries, HDF5 series), timing aside"
    exit 0
fi
echo "DIFFERENT: $diffs difference(s) over $n common cells"
exit 1
