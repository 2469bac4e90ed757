#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `bench replay`'s coding figures: for every cell that codes, the coding CPU per vector is
# (t_gram + t_corr + t_code + t_adapt) / vectors as the cell's own files in the results
# directory record them (the store's meta, written by another path), and "x ref" divides it
# by the reference codec's cell (--ref-codec, else the config's first static dictionary
# codec); a cell that codes nothing (full) has no figure; a bad --ref-codec is an error
# before any cell runs. The coding rounds (--coding-rounds R --coding-shares S) replay every
# cell's vectors R / S times over (each layer in exactly one share), the reference's ratio
# is 1 in every round, and bad counts are refused. A cell's coding phases never count more
# CPU than its encode calls took.
# usage: test_bench_replay.sh FADKV_BENCH  (FK_SRCDIR: the source tree)
set -euo pipefail
bin=$(realpath "$1")
src=${FK_SRCDIR:?FK_SRCDIR: the source tree}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in a b c d; do
    cat >"$tmp/$run.toml" <<TOML
[sweep]
name = "replay-figures"
output = "$tmp/res-$run"
jobs = 2
attention = false
[[dataset]]
name = "fortune"
traces = ["$src/datasets/embedded/fortune-byte-4L-00.h5"]
dictionary = "$src/datasets/dicts/fortune-byte-4L.h5"
defaults = { s = 8, n = 32, n_b = 16 }
[[codec]]
name = "full"
[[codec]]
name = "pl"
[[codec]]
name = "lexico"
[[codec]]
name = "gm"
TOML
done
replay() { "$bin" bench replay --config "$tmp/$1.toml" --no-kernel --ref-layers 0 \
           --kernels none "${@:2}"; }
replay a --tsv >"$tmp/a.tsv"
replay b --tsv --ref-codec gm >"$tmp/b.tsv"
replay c --tsv --coding-rounds 3 >"$tmp/c.tsv"            # 4 layers in 3 shares: 1 pass
replay d --tsv --coding-rounds 2 --coding-shares 1 >"$tmp/d.tsv" # all layers twice
# (rel_tol 1e-5: the meta records t_gram to 6 significant digits)
python3 - "$tmp" <<'PY'
import glob, math, os, sys
tmp = sys.argv[1]
order = ["full", "pl", "lexico", "gm"]
def kv(path):
    return dict(l.rstrip("\n").split("\t", 1) for l in open(path) if "\t" in l)
def check(run, ref):
    f = kv(os.path.join(tmp, run + ".tsv"))
    want = {}
    for p in glob.glob(os.path.join(tmp, "res-" + run, "cells", "*.meta")):
        m = kv(p)
        cpu = sum(float(m[k]) for k in ("t_gram", "t_corr", "t_code", "t_adapt"))
        want[m["codec"]] = 1e6 * cpu / float(m["vectors"])
        # the codec's phases lie inside encode(), whose thread CPU the replay measures
        # around each call: their apportioned CPU cannot exceed it
        phases = sum(float(m[k]) for k in ("t_corr", "t_code", "t_adapt"))
        assert phases <= float(m["t_encode"]) * (1 + 1e-5) + 1e-6, (run, m["codec"], phases,
                                                                   m["t_encode"])
    assert sorted(want) == sorted(order), sorted(want)
    for i, c in enumerate(order):
        us, x = f"cell {i} {c} coding us/vec", f"cell {i} {c} coding x ref"
        if c == "full":
            assert us not in f and x not in f, f"{run}: the full cell has coding figures"
            continue
        assert want[c] > 0 and math.isclose(float(f[us]), want[c], rel_tol=1e-5), \
            (run, c, f[us], want[c])
        assert math.isclose(float(f[x]), want[c] / want[ref], rel_tol=1e-5), \
            (run, c, f[x], want[c] / want[ref])
    assert float(f[f"cell {order.index(ref)} {ref} coding x ref"]) == 1.0
check("a", "lexico")
check("b", "gm")
def rounds(run, passes):
    f = kv(os.path.join(tmp, run + ".tsv"))
    metas = {}
    for p in glob.glob(os.path.join(tmp, "res-" + run, "cells", "*.meta")):
        m = kv(p)
        metas[m["codec"]] = int(m["vectors"])
    for i, c in enumerate(order):
        got = int(f[f"cell {i} {c} rounds vectors"])
        assert got == passes * metas[c], (run, c, got, metas[c])
        ratio = f.get(f"cell {i} {c} coding x ref rounds")
        if c == "full":
            assert ratio is None, f"{run}: the full cell has a rounds ratio"
        else:
            assert float(ratio) > 0, (run, c, ratio)
    assert float(f["cell 2 lexico coding x ref rounds"]) == 1.0
rounds("c", 1)
rounds("d", 2)
PY
for bad in "--coding-rounds 1" "--coding-rounds 16" "--coding-rounds 2 --coding-shares 0"; do
    # shellcheck disable=SC2086
    if replay a $bad >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL: $bad succeeded"; exit 1
    fi
    grep -q "coding-" "$tmp/err" || { echo "FAIL: $bad: $(cat "$tmp/err")"; exit 1; }
done
if replay a --ref-codec nosuch >"$tmp/out" 2>"$tmp/err"; then
    echo "FAIL: --ref-codec nosuch succeeded"; exit 1
fi
grep -q "ref-codec nosuch: no such codec" "$tmp/err" || { echo "FAIL: $(cat "$tmp/err")"; exit 1; }
! grep -q "^lexico " "$tmp/out" || { echo "FAIL: cells ran before the bad --ref-codec was refused"; exit 1; }
# --dataset: a config of two datasets replays the named one's cells only, on its own traces
# (each dataset's cells carry its options), and refuses a name it does not have
cat >"$tmp/two.toml" <<TOML
[sweep]
name = "replay-two"
output = "$tmp/res-two"
attention = false
[[dataset]]
name = "fortune"
traces = ["$src/datasets/embedded/fortune-byte-4L-00.h5"]
dictionary = "$src/datasets/dicts/fortune-byte-4L.h5"
defaults = { s = 8, n = 32 }
[[dataset]]
name = "baby"
traces = ["$src/datasets/embedded/babyllama-tok105-00.h5"]
dictionary = "$src/datasets/dicts/babyllama-tok105.h5"
defaults = { s = 4, n = 32 }
[[codec]]
name = "lexico"
TOML
"$bin" bench replay --config "$tmp/two.toml" --dataset baby --no-kernel --ref-layers 0 \
    --kernels none >"$tmp/two.out"
grep -q "head_dim 16" "$tmp/two.out" || { echo "FAIL: not babyllama's traces: $(head -1 "$tmp/two.out")"; exit 1; }
[ "$(grep -c '^lexico ' "$tmp/two.out")" = 1 ] || { echo "FAIL: not one lexico cell: $(cat "$tmp/two.out")"; exit 1; }
[ "$(ls "$tmp/res-two/cells/"*.meta | wc -l)" = 1 ] || { echo "FAIL: other cells ran"; exit 1; }
grep -q "^dataset	baby$" "$tmp/res-two/cells/"*.meta || { echo "FAIL: the cell is not baby's"; exit 1; }
if "$bin" bench replay --config "$tmp/two.toml" --dataset nosuch --no-kernel >"$tmp/out" 2>"$tmp/err"; then
    echo "FAIL: --dataset nosuch succeeded"; exit 1
fi
grep -q "dataset nosuch: .* has no such dataset (it has fortune, baby)" "$tmp/err" || { echo "FAIL: $(cat "$tmp/err")"; exit 1; }
echo "ok: bench replay's coding figures match the cells' own files"
