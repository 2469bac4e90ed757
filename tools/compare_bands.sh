#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Compares two results directories within each metric's cross-machine band: the numbers of
# results A are recorded as a baseline (`fadkv-bench check --update`) and those of B are
# checked against it (`check --tolerance portable`, docs/PORTABILITY.md). For a change
# meant to move numbers at rounding level (a kernel that sums in another order), where
# tools/compare_results.sh, which asks for identical files, must find differences:
#   tools/compare_bands.sh [--bin FADKV_BENCH] results-before/default results-after/default
# Metrics: reconstruction error, attention fidelity, bytes, support size and adaptation
# counts (override with METRICS=a,b,...). Prints check's table and verdict; exit as check.
set -euo pipefail
bin=build/fadkv-bench
[ "${1:-}" = --bin ] && { bin=$2; shift 2; }
[ $# -eq 2 ] && [ -d "$1" ] && [ -d "$2" ] || {
    sed -n '2,10p' "$0" >&2; exit 2; }
metrics=${METRICS:-rel_err_mean,attn_kl,attn_cos,top8_overlap,bytes,nnz_mean,appends,replacements}
tmp=$(mktemp -d /tmp/fk-bands-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$bin" check --update --baseline "$tmp/a.csv" --results "$1" --metrics "$metrics" >/dev/null
"$bin" check --baseline "$tmp/a.csv" --results "$2" --strict
