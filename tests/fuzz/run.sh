#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A bounded libFuzzer run of every target (CI: about 1 minute each).
#   CC=clang meson setup build-fuzz -Dfuzzing=true -Dtests=false --buildtype=debugoptimized
#   meson compile -C build-fuzz
#   tests/fuzz/run.sh [BUILD_DIR (build-fuzz)] [SECONDS PER TARGET (60)] [TARGET...]
# The committed seeds (tests/fuzz/corpus/<target>/) are copied to a scratch corpus, so the
# run never edits the repository. A crash, sanitizer report or leak stops that target; its
# input is kept in $FK_FUZZ_OUT (default: a scratch dir, printed) and the script exits 1.
# Prints, per target, the executions, the coverage reached and the outcome.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-build-fuzz}
SECS=${2:-60}
shift 2 2>/dev/null || shift $#
TARGETS=${*:-toml sweep trace}
OUT=${FK_FUZZ_OUT:-$(mktemp -d /tmp/fk-fuzz.XXXXXX)}
mkdir -p "$OUT"
status=0
for t in $TARGETS; do
    exe=$BUILD/tests/fuzz/fuzz_$t
    if [ ! -x "$exe" ]; then
        echo "fuzz_$t: $exe not built (meson setup with -Dfuzzing=true and CC=clang)" >&2
        status=1
        continue
    fi
    corpus=$OUT/corpus-$t
    mkdir -p "$corpus" "$OUT/artifacts-$t"
    cp "$HERE/corpus/$t"/* "$corpus/"
    extra=()
    case $t in
        toml | sweep) extra=(-dict="$HERE/sweep.dict" -max_len=4096) ;;
        trace) extra=(-max_len=2048) ;;
    esac
    log=$OUT/fuzz_$t.log
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
        "$exe" -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OUT/artifacts-$t/" "${extra[@]}" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
    if [ "$rc" = 0 ]; then
        echo "fuzz_$t: ok, ${runs:-?} executions in ${SECS} s, $cov, corpus $(ls "$corpus" | wc -l)"
    else
        status=1
        echo "fuzz_$t: FAILED (exit $rc) after ${runs:-?} executions; input(s):"
        ls "$OUT/artifacts-$t"/* 2>/dev/null | sed 's/^/    /'
        grep -E 'ERROR: |runtime error|SUMMARY|^    #[0-9] ' "$log" | head -20 | sed 's/^/    /'
        echo "    full log: $log"
    fi
done
echo "fuzz output: $OUT"
exit $status
