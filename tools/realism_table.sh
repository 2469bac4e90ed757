#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The realism table of a configs/realism.toml run: one row per dataset, the same metrics on
# real and synthetic data side by side (docs/GUIDE.md, "Realism"). Reads RESULTS_DIR/cells.csv
# (columns by name, docs/RESULTS.md), writes RESULTS_DIR/realism.md and prints it.
#   tools/realism_table.sh results/realism
# Cells: per dataset, lexico, lexico-adp, and the two fadkv cells at delta_k = 0.3,
# delta_v = 0.42 with tau_c = 0 and 4 (the first of each in sweep order). Columns:
#   err lexico / fadkv   rel_err_mean of lexico and of fadkv tau_c 0 (as stored)
#   recall@N/16          pool_recall_<n> of the fadkv tau_c 0 cell, n = its pool size
#   inactive, overlap    inactive_after_prefill, inactive_overlap of the lexico cell
#   growth               dict_size_norm_final of lexico-adp (N_T/N at the end)
#   KL lexico            attn_kl of lexico
#   KL tau0, KL tau4     attn_kl of fadkv tau_c 0 and tau_c 4
#   tau4/tau0            their ratio (< 1: replacement with tau_c 4 lowers attention KL)
# Exit 2 on a missing file or column, naming it.
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1/cells.csv" ] || { echo "usage: $0 RESULTS_DIR (with cells.csv)" >&2; exit 2; }
dir=$1
awk -F, '
function col(name) { if (!(name in ix)) { print "realism_table: cells.csv lacks column " name > "/dev/stderr"; bad = 1; exit 2 } return ix[name] }
function v(id, name) { return (id in row) ? row[id, col(name)] : "" }
function f(x, fmt) { return x == "" || x == "nan" ? "-" : sprintf(fmt, x) }
NR == 1 { for (i = 1; i <= NF; i++) if (!($i in ix)) ix[$i] = i; next }
{
    if ($col("status") != "ok") next
    ds = $col("dataset"); c = $col("codec"); key = ""
    if (c == "lexico") key = "lex"
    else if (c == "lexico-adp") key = "adp"
    else if (c == "fadkv" && $col("delta_k") + 0 == 0.3 && $col("delta_v") + 0 == 0.42)
        key = "tau" ($col("tau_c") + 0)
    if (key == "") next
    id = ds "/" key
    if (id in row) next          # the first such cell in sweep order
    row[id] = 1
    for (i = 1; i <= NF; i++) row[id, i] = $i
    if (!(ds in seen)) { seen[ds] = 1; order[++n] = ds }
}
END {
    if (bad) exit 2
    print "| dataset | err lexico | err fadkv | recall@N/16 | inactive | overlap | growth N_T/N | KL lexico | KL tau_c 0 | KL tau_c 4 | tau4/tau0 |"
    print "|---|---|---|---|---|---|---|---|---|---|---|"
    for (k = 1; k <= n; k++) {
        ds = order[k]
        pool = v(ds "/tau0", "n")
        rec = pool == "" ? "" : v(ds "/tau0", "pool_recall_" pool)
        k0 = v(ds "/tau0", "attn_kl"); k4 = v(ds "/tau4", "attn_kl")
        ratio = (k0 != "" && k4 != "" && k0 != "nan" && k4 != "nan" && k0 + 0 > 0) ? k4 / k0 : ""
        printf "| %s | %s | %s | %s (n %s) | %s | %s | %s | %s | %s | %s | %s |\n", ds,
            f(v(ds "/lex", "rel_err_mean"), "%.3f"), f(v(ds "/tau0", "rel_err_mean"), "%.3f"),
            f(rec, "%.2f"), pool == "" ? "-" : pool,
            f(v(ds "/lex", "inactive_after_prefill"), "%.2f"), f(v(ds "/lex", "inactive_overlap"), "%.2f"),
            f(v(ds "/adp", "dict_size_norm_final"), "%.4f"), f(v(ds "/lex", "attn_kl"), "%.4f"),
            f(k0, "%.4f"), f(k4, "%.4f"), f(ratio, "%.2f")
    }
}' "$dir/cells.csv" > "$dir/realism.md.tmp"
mv "$dir/realism.md.tmp" "$dir/realism.md"
cat "$dir/realism.md"
