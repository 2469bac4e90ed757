#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CI regression gate: runs tests/ci/ci-regression.toml into a temporary directory and
# compares it with tests/ci/baseline.csv. With --update, rewrites the baseline instead.
# usage: tests/ci/run_gate.sh [FADKV_BENCH] [--update]
set -euo pipefail
bin=${1:-build/fadkv-bench}
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$(dirname "$0")/../.."
out=$(mktemp -d /tmp/fk-gate-XXXXXX)
trap 'rm -rf "$out"' EXIT
"$bin" --config tests/ci/ci-regression.toml --quiet --set "sweep.output=\"$out\""
if [ "${2:-}" = --update ]; then
    "$bin" check --baseline tests/ci/baseline.csv --results "$out" --update
else
    "$bin" check --baseline tests/ci/baseline.csv --results "$out"
fi
