#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Per-cell overhead of a sweep of many small cells: a 4,992-cell grid of topk (s 1..16 x
# coef fp32/fp16/fp8 x n_b 0..103) on one embedded babyllama trace, one job, run into a
# temporary directory. A cell commits its .meta last, so the time between the commits of
# cells a and b, divided by b - a, is what a cell there cost, its replay and everything
# around it (claim, worker round trip, commit, the tables now and then). Prints it over 50
# cells from cells 2, 1,000, 2,500 and 4,942 and its ratio to the first: a sweep whose
# commits grew with the cells done (tables rewritten from every cell at each commit) shows
# ratios far above 1.
# usage: tools/bench_many_cells.sh [FADKV_BENCH] [EXTRA SWEEP ARGS...]
set -euo pipefail
bin=${1:-build/fadkv-bench}
shift || true
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/fk-many-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trace=$(ls "$PWD"/datasets/embedded/babyllama-tok105-00.h5)
nb=$(seq -s, 0 103)
cat >"$tmp/many.toml" <<EOF
[sweep]
name = "many-cells"
output = "$tmp/res"
traces = ["$trace"]
jobs = 1
attention = false
recall = false

[[codec]]
name = "topk"
grid = { s = [$(seq -s, 1 16)], coef = ["fp32", "fp16", "fp8"], n_b = [$nb] }
EOF
t0=$(date +%s.%N)
"$bin" --config "$tmp/many.toml" --quiet "$@"
t1=$(date +%s.%N)
n=$(ls "$tmp/res/cells" | grep -c '\.meta$')
find "$tmp/res/cells" -name '*.meta' -printf '%T@\n' | sort -g >"$tmp/times"
awk -v total="$(echo "$t1 - $t0" | bc)" -v n="$n" '
    { t[NR] = $1 }
    END {
        printf "%d cells in %.1f s (%.2f ms per cell on average)\n", n, total, 1000 * total / n
        split("10 1000 2500 4967", at, " ")
        for (k = 1; k <= 4; k++) {
            c = at[k] + 0; a = c - 9; if (a < 2) a = 2; b = a + 50; if (b > n) { b = n; a = n - 50 }
            m[k] = (t[b] - t[a]) / (b - a)
            printf "  cells %4d..%4d: %.2f ms per cell, %.2fx the first\n", a, b, 1000 * m[k],
                   m[k] / m[1]
        }
    }' "$tmp/times"
