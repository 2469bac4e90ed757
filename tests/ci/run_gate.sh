#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CI regression gate: runs tests/ci/ci-regression.toml into a temporary directory and
# compares it with the baseline of the OpenBLAS kernel set that ran (provenance.json
# "openblas_kernels"): tests/ci/baseline-KERNELS.csv. Kernel sets round SGEMMs differently,
# and the greedy coders turn a last-bit difference into another atom now and then (up to a
# few percent on a 2-vector-per-layer mean), so each kernel set has its own exact baseline.
# With --update, writes (or rewrites) the baseline of the kernel set that ran.
# usage: tests/ci/run_gate.sh [FADKV_BENCH] [--update]
set -euo pipefail
bin=${1:-build/fadkv-bench}
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$(dirname "$0")/../.."
out=$(mktemp -d /tmp/fk-gate-XXXXXX)
trap 'rm -rf "$out"' EXIT
"$bin" --config tests/ci/ci-regression.toml --quiet --set "sweep.output=\"$out\""
kernels=$(sed -n 's/^ *"blas_kernels": *"\([A-Za-z0-9_]*\)".*/\1/p' "$out/provenance.json")
[ -n "$kernels" ] || { echo "run_gate: $out/provenance.json names no blas_kernels" >&2; exit 1; }
baseline=tests/ci/baseline-$kernels.csv
if [ "${2:-}" = --update ]; then
    "$bin" check --baseline "$baseline" --results "$out" --update
elif [ ! -f "$baseline" ]; then
    echo "run_gate: no baseline for the OpenBLAS kernel set '$kernels' (have:" \
         "$(cd tests/ci && ls baseline-*.csv | tr '\n' ' '))." >&2
    echo "run_gate: record one from a trusted build: tests/ci/run_gate.sh BIN --update" >&2
    exit 1
else
    echo "run_gate: OpenBLAS kernels $kernels, baseline $baseline"
    "$bin" check --baseline "$baseline" --results "$out"
fi
