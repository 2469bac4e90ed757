#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `bench omp --kernels`: the child processes that rerun the benchmark for the other kernel
# column (and this run's kernels again) get this run's arguments and report their figures. With --kernels same the
# child keeps this environment (OPENBLAS_CORETYPE is never set here), so its codes must be
# bit-identical to an independent --tsv run of the same arguments; a bad mode is a usage
# error.
set -u
BIN=$1
fail() { echo "FAIL: $*"; exit 1; }
ARGS=(bench omp --atoms 128 --dim 32 --sparsity 4 --signals 512 --naive 64 --repeats 1
      --pool 16 --seed 7)

tsv=$("$BIN" "${ARGS[@]}" --tsv --kernels none) || fail "--tsv run failed"
kern=$(printf '%s\n' "$tsv" | awk -F'\t' '$1 == "kernels" {print $2}')
hash=$(printf '%s\n' "$tsv" | awk -F'\t' '$1 == "codes_hash" {print $2}')
[ -n "$kern" ] || fail "--tsv printed no kernels line: $tsv"
[ -n "$hash" ] || fail "--tsv printed no codes_hash line: $tsv"
printf '%s\n' "$tsv" | grep -q "^gm_rel	" || fail "--tsv printed no gm_rel line: $tsv"
printf '%s\n' "$tsv" | grep -q "SGEMM" && fail "--tsv printed the table too"

out=$("$BIN" "${ARGS[@]}" --kernels same) || fail "--kernels same failed: $out"
printf '%s\n' "$out" | grep -q "^OpenBLAS kernel sets: this run $kern " ||
    fail "no kernel-set header naming $kern: $out"
line=$(printf "%s\n" "$out" | grep "^  codes hash  ") || fail "no codes hash row: $out"
set -- $line
[ "$3" = "$hash" ] || fail "this run's codes hash $3, the --tsv run's $hash"
[ "$4" = "$hash" ] || fail "the child's codes hash $4, the --tsv run's $hash"
[ "$5" = "$hash" ] || fail "the second child's codes hash $5, the --tsv run's $hash"
[ "$6 $7" = "all equal" ] || fail "codes hash row says $6 $7"
printf '%s\n' "$out" | grep -q "^  SGEMM floor vectors/s " || fail "no SGEMM floor row: $out"

# the greedy loop's roofline: the counts by hand for N 128, s 4 (three correlation passes,
# pass k: k - 1 earlier rows, c read and written, its row written; one Gram row each), and
# a reachable share of the floor in (0, 1]
plain=$("$BIN" "${ARGS[@]}" --kernels none) || fail "plain run failed"
printf '%s\n' "$plain" | grep -q "^  counted  *1152 multiply-adds, 6 KiB from L2, 2 KiB of Gram rows$" ||
    fail "roofline counts: $(printf '%s\n' "$plain" | grep -A1 '^roofline')"
best=$(printf '%s\n' "$plain" | awk '$1 == "best" && $2 == "reachable" {print $3}')
awk -v b="$best" 'BEGIN { exit !(b > 0 && b <= 1) }' || fail "best reachable share '$best'"

# the screening coders' stages: each coder has the stages it runs and no other (omp: no
# Top-n or refinement; pl: no greedy loop beyond its call; gm all four)
stages() { printf '%s\n' "$plain" | awk -v c="$1" '/^    [a-z]/ && $1 == c && NF == 5 {print $2, $3, $4, $5}'; }
read -r oc ot og or <<< "$(stages omp)"
read -r gc gt gg gr <<< "$(stages gm)"
read -r pc pt pg pr <<< "$(stages pl)"
awk -v a="$oc" -v b="$ot" -v c="$og" -v d="$or" 'BEGIN { exit !(a > 0 && b == 0 && c > 0 && d == 0) }' ||
    fail "omp stages '$oc $ot $og $or'"
awk -v a="$gc" -v b="$gt" -v c="$gg" -v d="$gr" 'BEGIN { exit !(a > 0 && b > 0 && c > 0 && d > 0) }' ||
    fail "gm stages '$gc $gt $gg $gr'"
awk -v a="$pc" -v b="$pt" -v c="$pg" -v d="$pr" 'BEGIN { exit !(a > 0 && b > 0 && c < b && d > 0) }' ||
    fail "pl stages '$pc $pt $pg $pr'"

"$BIN" "${ARGS[@]}" --kernels 'Has well' >/dev/null 2>&1
[ $? -eq 2 ] || fail "--kernels 'Has well' should be a usage error (2)"
echo "ok: --kernels same reproduces the --tsv run's codes ($hash, $kern kernels)"
