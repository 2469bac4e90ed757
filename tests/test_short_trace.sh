#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A trace of T tokens with cells whose buffer keeps n_b >= T tokens exact: --dry-run and the
# run warn once per (dataset, trace, codec, n_b), naming all of them; the cells run with
# bytes_ratio_full 1 and empty reconstruction errors; a cell that compresses is not named. usage: test_short_trace.sh FADKV_BENCH
set -euo pipefail
bin=$(realpath "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
"$bin" synth --out traces --sequences 1 --layers 2 --q-heads 4 --kv-heads 2 --head-dim 64 \
    --prefill 24 --decode 16 >/dev/null
cat >s.toml <<'TOML'
[sweep]
name = "short"
output = "res"
traces = "traces/*.h5"
[[codec]]
name = "uniform"
grid = { n_b = [8, 40, 64] }
TOML
trace=traces/synth-custom-L2-q4-kv2-d64-s1-0.h5
"$bin" --config s.toml --dry-run >out 2>err
for nb in 40 64; do
    n=$(grep -c "warning: dataset 'default', trace $trace: codec 'uniform' with n_b = $nb keeps all T = 40 tokens exact" err || true)
    [ "$n" = 1 ] || { echo "FAIL: --dry-run warned $n time(s) for n_b = $nb:" >&2; cat err >&2; exit 1; }
done
! grep -q "n_b = 8 " err || { echo "FAIL: the compressing cell (n_b = 8) was warned about" >&2; exit 1; }
"$bin" --config s.toml --quiet 2>err
[ "$(grep -c 'T <= n_b' err)" = 2 ] || { echo "FAIL: the run did not warn twice:" >&2; cat err >&2; exit 1; }
python3 - res/cells.csv <<'PY'
import csv, math, sys
rows = {int(r["n_b"]): r for r in csv.DictReader(open(sys.argv[1]))}
for nb in (40, 64):
    r = rows[nb]
    assert r["status"] == "ok", r
    assert math.isnan(float(r["rel_err_mean"] or "nan")), r["rel_err_mean"]
    assert float(r["bytes_ratio_full"]) == 1, r["bytes_ratio_full"]
e = float(rows[8]["rel_err_mean"])
assert 0 < e < 1 and float(rows[8]["bytes_ratio_full"]) < 1, rows[8]
PY
echo "short_trace: ok"
