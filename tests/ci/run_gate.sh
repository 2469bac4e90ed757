#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CI regression gate: runs tests/ci/ci-regression.toml into a temporary directory and
# compares it with tests/ci/baseline.csv through `fadkv-bench check` and its cross-machine
# bands (docs/PORTABILITY.md): every (cell, kind) aggregate and every row of rel_err_mean,
# attn_kl and bytes. One baseline serves every CPU, OpenBLAS kernel set, BLAS and compiler.
# With --update, records the baseline from this build instead (review the diff).
# usage: tests/ci/run_gate.sh [FADKV_BENCH] [--update]
set -euo pipefail
bin=${1:-build/fadkv-bench}
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$(dirname "$0")/../.."
out=$(mktemp -d /tmp/fk-gate-XXXXXX)
trap 'rm -rf "$out"' EXIT
"$bin" --config tests/ci/ci-regression.toml --quiet --set "sweep.output=\"$out\""
kernels=$(sed -n 's/^ *"blas_config": *"\([^"]*\)".*/\1/p' "$out/provenance.json")
echo "run_gate: $kernels"
if [ "${2:-}" = --update ]; then
    "$bin" check --baseline tests/ci/baseline.csv --results "$out" --update
else
    "$bin" check --baseline tests/ci/baseline.csv --results "$out" --strict
fi
