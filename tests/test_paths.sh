#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The path rule of sweep files (configs/README.md, Paths): relative paths resolve against
# the config file's folder from any working directory, --set values against the current
# directory, and a glob that matches nothing names what it tried. usage: test_paths.sh BIN
set -euo pipefail
bin=$(realpath "$1")
src=$(realpath "${FK_SRCDIR:?}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# 1. the shipped CI config from another directory: the repository's data and results folder
cd "$tmp"
"$bin" --config "$src/tests/ci/ci-regression.toml" --print-config >pc.txt
grep -q "^#   $src/datasets/embedded/babyllama-tok105-" pc.txt || fail "ci-regression.toml from $tmp: traces not resolved into $src/datasets"
grep -q "^# dataset fortune: dictionary $src/datasets/dicts/fortune-byte-4L.h5" pc.txt || fail "the dictionary is not resolved into $src/datasets/dicts"
ids_here=$("$bin" --config "$src/tests/ci/ci-regression.toml" --dry-run | awk 'NR > 1 && NF > 3 {print $1}' | sort | md5sum)
ids_root=$(cd "$src" && "$bin" --config tests/ci/ci-regression.toml --dry-run | awk 'NR > 1 && NF > 3 {print $1}' | sort | md5sum)
[ "$ids_here" = "$ids_root" ] || fail "the cell ids depend on the working directory"
# from the repository root, the paths print as before (relative, normalised; a config two
# folders down, and one that needs no generated data: a fresh clone has no datasets/synth)
(cd "$src" && "$bin" --config tests/ci/ci-regression.toml --print-config) | grep -q "^#   datasets/embedded/babyllama-tok105-00.h5" ||
    fail "tests/ci/ci-regression.toml from the root: traces not printed as datasets/embedded/..."

# 2. a config in A naming its neighbours, run from B: traces, dictionary-less, output, plugin
mkdir -p A/tr B
"$bin" synth --out A/tr --sequences 1 --layers 1 --q-heads 2 --kv-heads 1 --head-dim 64 \
    --prefill 24 --decode 16 >/dev/null
cat >A/sweep.toml <<'TOML'
[sweep]
name = "paths"
output = "res"
traces = "tr/*.h5"
[[codec]]
name = "full"
n_b = 4
TOML
(cd B && "$bin" --config ../A/sweep.toml --quiet) || fail "the sweep in A run from B failed"
[ -f A/res/cells.csv ] || fail "output = \"res\" of A/sweep.toml did not go to A/res"
[ ! -e B/res ] || fail "output went to the working directory"
# --set: relative to the current directory
(cd B && "$bin" --config ../A/sweep.toml --quiet --set 'sweep.output="mine"') || fail "--set output failed"
[ -f B/mine/cells.csv ] || fail "--set sweep.output=\"mine\" did not go to B/mine"

# 3. a glob that matches nothing names the path it tried and the folder
sed 's#^traces = .*#traces = "nothere/*.h5"#' A/sweep.toml >A/bad.toml
rc=0
(cd B && "$bin" --config ../A/bad.toml --dry-run) >out 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "a glob matching nothing exited $rc"
grep -q "traces: 'nothere/\*.h5' matches no file: looked for ../A/nothere/\*.h5 (relative paths in a sweep file resolve against the folder of that file, here ../A)" out ||
    { fail "the glob error does not say where it looked:"; cat out >&2; }
rc=0
(cd B && "$bin" --config ../A/sweep.toml --dry-run --set 'sweep.traces="tr/*.h5"') >out 2>&1 || rc=$?
grep -q "looked for tr/\*.h5 (relative to the current directory, $tmp/B)" out ||
    { fail "a --set glob error does not name the current directory:"; cat out >&2; }

[ "$fails" = 0 ] || { echo "$fails check(s) failed" >&2; exit 1; }
echo "paths: all checks passed"
