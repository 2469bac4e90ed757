#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# valgrind memcheck on fadkv-bench running a tiny CI-like sweep (issue 9): 2 codecs (lexico,
# fadkv) on 1 small real trace with attention fidelity, then the same command again (the
# resume path), a config error and a damaged trace (the error paths), and `info`.
# Passes when memcheck reports 0 errors and no definite leaks (--error-exitcode=1) and every
# command exits as expected.
# usage: tests/valgrind.sh [FADKV_BENCH]   (default: $FK_BIN, then build/fadkv-bench)
set -u
SRC=${FK_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
BIN=${1:-${FK_BIN:-$SRC/build/fadkv-bench}}
case "$BIN" in /*) ;; *) BIN="$PWD/$BIN" ;; esac
if ! command -v valgrind >/dev/null; then
    echo "SKIP: valgrind not installed"
    exit 77
fi
W=$(mktemp -d /tmp/fk-valgrind.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OPENBLAS_NUM_THREADS=1
VG=(valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite
    --show-leak-kinds=definite --error-exitcode=99 --track-origins=yes --num-callers=30)
cat >"$W/tiny.toml" <<EOF2
[sweep]
name = "valgrind"
traces = ["$SRC/datasets/embedded/aidreams-260k-00.h5"]
dictionary = "$SRC/datasets/dicts/aidreams-260k.h5"
output = "$W/out"
jobs = 2
attention = true
attn_stride = 8

[[codec]]
name = "lexico"
s = 4
n_b = 16

[[codec]]
name = "fadkv"
s = 4
n = 32
n_b = 16
EOF2
sed 's/^s = 4$/s = "four"/' "$W/tiny.toml" >"$W/bad.toml"
printf 'not hdf5\n' >"$W/bad.h5"
sed "s#^traces = .*#traces = [\"$W/bad.h5\"]#; s#^output = .*#output = \"$W/out2\"#" \
    "$W/tiny.toml" >"$W/badtrace.toml"

fails=0
# step NAME EXPECTED_EXIT ARGS...
step() {
    local name=$1 want=$2
    shift 2
    local t0=$SECONDS
    "${VG[@]}" --log-file="$W/$name.vg" "$BIN" "$@" >"$W/$name.out" 2>&1
    local rc=$?
    local errs leak
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$W/$name.vg" | tail -1)
    leak=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$W/$name.vg" | tail -1)
    if [ "$rc" = "$want" ]; then
        echo "PASS  $name: exit $rc, $errs errors, definitely lost ${leak:-0} bytes ($((SECONDS - t0)) s)"
    else
        fails=$((fails + 1))
        echo "FAIL  $name: exit $rc (expected $want; 99 = memcheck errors), $errs errors," \
             "definitely lost ${leak:-0} bytes"
        grep -E '^==[0-9]+== (Invalid|Conditional|Use of|Syscall|Mismatched|[0-9,]+ bytes in)' \
            -A 12 "$W/$name.vg" | head -60
        tail -5 "$W/$name.out"
    fi
}
step sweep 0 --config "$W/tiny.toml"
n_ok=$(grep -c ',ok,' "$W/out/cells.csv" 2>/dev/null)
if [ "$n_ok" != 2 ]; then
    fails=$((fails + 1))
    echo "FAIL  sweep: cells.csv has ${n_ok:-no} ok cells, expected 2"
fi
step resume 0 --config "$W/tiny.toml"
step config-error 1 --config "$W/bad.toml"
step damaged-trace 1 --config "$W/badtrace.toml"
step info 0 info "$SRC/datasets/embedded/aidreams-260k-00.h5" "$SRC/datasets/dicts/aidreams-260k.h5" "$W/out"
# the CI regression config itself (14 cells, every codec, attention on; run from the
# source root, where its relative paths point)
here=$PWD
cd "$SRC" || exit 1
step ci-regression 0 --config tests/ci/ci-regression.toml --quiet \
    --set "sweep.output=\"$W/ci\"" --set sweep.jobs=1
cd "$here" || exit 1
echo "valgrind: $((6 - fails)) passed, $fails failed"
[ "$fails" = 0 ]
