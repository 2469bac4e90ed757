#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Measures how far the numbers of one sweep move across machines: the sweep (default the CI
# gate's, tests/ci/ci-regression.toml) is run with BIN and OPENBLAS_CORETYPE unset (the
# reference), then with every OpenBLAS kernel set this CPU can run and with each further
# binary given (a BLIS build, a -Dsimd=generic build, a clang build, ...), each compared with
# the reference by `fadkv-bench check --tolerance exact` on every gateable metric. Prints, per
# metric, the largest relative difference of a cell's aggregate (mean over its rows of one
# kind) and of a single (trace, layer, kind) row in each run, their maximum, and the largest
# difference as a multiple of the metric's cross-machine band (x band: below 1 everywhere,
# or a band is too tight): the table the bands of report/fk_check.c come from
# (docs/PORTABILITY.md).
#
# usage: tools/measure_spread.sh [--config SWEEP.toml] [--cores "NAME..."] BIN [OTHER_BIN...]
#   --cores: the OpenBLAS kernel sets to run (default: all that this CPU runs, listed below)
#   OTHER_BIN may be NAME=VALUE,...:BIN to run it in an environment (e.g.
#   BLIS_ARCH_TYPE=3:build-blis/fadkv-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
config=tests/ci/ci-regression.toml
cores=(Haswell Zen Sandybridge Nehalem Prescott)
grep -qw avx512f /proc/cpuinfo && cores+=(SkylakeX Cooperlake)
while [ $# -gt 1 ]; do
    case "$1" in
        --config) config=$2; shift 2 ;;
        --cores) read -r -a cores <<<"$2"; shift 2 ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
bin=$(abs "$1")
shift
tmp=$(mktemp -d /tmp/fk-spread-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

metrics=$("$bin" check --help | awk '/^   [a-z0-9_]+ +\(/ { printf "%s%s", n++ ? "," : "", $1 }')

run() { # run LABEL ENV BIN: the sweep into $tmp/LABEL
    local label=$1 envs=$2 b=$3
    local -a e=(env -u OPENBLAS_CORETYPE -u BLIS_ARCH_TYPE) kv=()
    [ -z "$envs" ] || IFS=, read -r -a kv <<<"$envs"
    e+=("${kv[@]}")
    "${e[@]}" "$b" --config "$config" --quiet --set "sweep.output=\"$tmp/$label\"" >/dev/null
}

run reference "" "$bin"
"$bin" check --update --metrics "$metrics" --baseline "$tmp/base.csv" --results "$tmp/reference" \
    >/dev/null
ref_kernels=$(sed -n 's/^ *"blas_kernels": *"\([^"]*\)".*/\1/p' "$tmp/reference/provenance.json")

labels=()
envs=()
bins=()
for c in "${cores[@]}"; do
    labels+=("")
    envs+=("OPENBLAS_CORETYPE=$c")
    bins+=("$bin")
done
for spec in "$@"; do
    e=""
    b=$spec
    if [[ "$spec" == *:* ]]; then
        e=${spec%%:*}
        b=${spec#*:}
    fi
    b=$(abs "$b")
    labels+=("")
    envs+=("$e")
    bins+=("$b")
done

declare -A agg row use
for i in "${!labels[@]}"; do
    dir="$tmp/run$i"
    run "run$i" "${envs[$i]}" "${bins[$i]}"
    labels[$i]=$(sed -n -e 's/^ *"blas": *"\([^"]*\)".*/\1/p' \
                     -e 's/^ *"blas_kernels": *"\([^"]*\)".*/\1/p' \
                     -e 's/^ *"simd": *"\([^,"]*\).*/\1/p' \
                     -e 's/^ *"compiler": *"\([^"]*\)".*/\1/p' "$dir/provenance.json" | paste -sd' ' -)
    out=$("$bin" check --tolerance exact --metrics "$metrics" --baseline "$tmp/base.csv" \
          --results "$dir" || true)
    line=$(printf '%s\n' "$out" | sed -n 's/^largest drift per metric[^:]*: //p')
    IFS=';' read -r -a parts <<<"$line"
    for part in "${parts[@]}"; do
        read -r m _ a ua _ r ur <<<"$part"
        agg[$i,$m]=${a%,}
        row[$i,$m]=$r
        use[$i,$m]=$(awk -v x="${ua//[(x),]/}" -v y="${ur//[(x),]/}" 'BEGIN { print (y + 0 > x + 0) ? y : x }')
    done
done

echo "spread of $config against $(basename "$bin") with OPENBLAS_CORETYPE unset ($ref_kernels kernels)"
echo "runs:"
for i in "${!labels[@]}"; do
    echo "  [$i] ${labels[$i]}${envs[$i]:+ (${envs[$i]})}"
done
printf '%-24s' "metric (aggregate / row)"
for i in "${!labels[@]}"; do printf ' %17s' "[$i]"; done
printf ' %17s %8s\n' "max" "x band"
IFS=, read -r -a ms <<<"$metrics"
for m in "${ms[@]}"; do
    printf '%-24s' "$m"
    ma=0
    mr=0
    mu=0
    for i in "${!labels[@]}"; do
        a=${agg[$i,$m]:-?}
        r=${row[$i,$m]:-?}
        printf ' %8s/%-8s' "$a" "$r"
        ma=$(awk -v x="$ma" -v y="$a" 'BEGIN { print (y + 0 > x + 0) ? y : x }')
        mr=$(awk -v x="$mr" -v y="$r" 'BEGIN { print (y + 0 > x + 0) ? y : x }')
        mu=$(awk -v x="$mu" -v y="${use[$i,$m]:-0}" 'BEGIN { print (y + 0 > x + 0) ? y : x }')
    done
    printf ' %8s/%-8s %8s\n' "$ma" "$mr" "$mu"
done
