#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A model dataset in a sweep (closed loop, docs/RESULTS.md): the cells against
`fadkv-bench loop` run by hand on the same prompt, and the store's guarantees.

  - the dataset's trace of prompt i is the exact greedy decode (its ids are the loop's
    reference ids), and the cell HDF5's per-step series equal `fadkv-bench loop --series`
    for the same prompt and codec (kl, top1, NLLs, free-running tokens);
  - `full` with every token handed over: e2e KL 0, top-1 1, perplexity ratio 1, loop
    attention cosine 1; a 2-bit cache: e2e KL > 0;
  - a rerun computes nothing; two shards merged give the single run's numbers;
    `check` gates the closed-loop columns (a baseline of the run passes, a baseline with a
    changed e2e_kl fails);
  - a model dataset without steps, or with traces too, is refused naming the file's line.

usage: test_loop_sweep.py FADKV_BENCH_EXE SRCDIR
Exits 77 (skip) when numpy/h5py or the models are missing.
"""
import csv
import os
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(SKIP)

failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def rows(path):
    return list(csv.DictReader(open(path)))


CONFIG = """
[sweep]
name = "loop-test"
output = "{out}"
jobs = 2
attention = true
attn_stride = 1
recall = false

[[dataset]]
name = "fortune"
model = "{model}/model.bin"
tokenizer = "{model}/tokenizer.bin"
prompts = ["You will be", [256, 78, 101, 118, 101, 114]]
steps = {steps}
dictionary = "{src}/datasets/dicts/fortune-byte-4L.h5"
{extra}

[[codec]]
name = "full"
n_b = 0

[[codec]]
name = "uniform"
bits = 2
n_b = 4

[[codec]]
name = "lexico"
n_b = 4

[[codec]]
name = "full"
n_b = 0
evict = "streaming"
sinks = 2
recent = 10
"""


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    exe, src = sys.argv[1], os.path.abspath(sys.argv[2])
    model = os.path.join(os.environ.get("FK_SHARED", "/work/shared"), "data", "models",
                         "fortune-byte-4L")
    if not os.path.exists(os.path.join(model, "model.bin")):
        print(f"skip: {model} absent")
        return SKIP
    S = 24
    with tempfile.TemporaryDirectory(prefix="fk_loop_sweep_") as tmp:
        def config(name, out, steps=S, extra=""):
            p = os.path.join(tmp, name)
            open(p, "w").write(CONFIG.format(out=out, model=model, src=src, steps=steps,
                                             extra=extra))
            return p

        res = os.path.join(tmp, "res")
        cfg = config("loop.toml", res)
        r = run([exe, "--config", cfg, "--quiet"])
        expect(r.returncode == 0, f"sweep runs (exit {r.returncode}) {r.stderr[-300:]}")
        if r.returncode:
            return 1
        allc = rows(os.path.join(res, "cells.csv"))
        cells = {c["codec"]: c for c in allc if not c.get("evict")}
        full, uni = cells["full"], cells["uniform"]
        stream = [c for c in allc if c.get("evict") == "streaming"]
        expect(float(full["e2e_kl"]) == 0 and float(full["e2e_top1"]) == 1 and
               float(full["e2e_ppl_ratio"]) == 1 and float(full["free_token_agree"]) == 1,
               "full in the loop: e2e KL 0, top-1 1, perplexity ratio 1, free agreement 1")
        expect(abs(float(full["loop_attn_cos"]) - 1) < 1e-12 and
               float(full["loop_attn_kl"]) == 0, "full: loop attention cosine 1, KL 0")
        expect(float(uni["e2e_kl"]) > 0 and float(uni["loop_attn_kl"]) > 0,
               f"2-bit uniform: e2e KL {uni['e2e_kl']} > 0")
        expect(int(float(uni["loop_steps"])) == 2 * S, f"loop_steps = 2 prompts x {S}")
        summ = [x for x in rows(os.path.join(res, "summary.csv"))
                if x["cell_id"] == uni["cell_id"]]
        expect(len(summ) == 2 * 4 * 2 and all(x["loop_attn_kl"] not in ("", "nan")
                                              for x in summ),
               "summary.csv: loop_attn_* on every (prompt, layer, kind) row")

        # the cell's series against `fadkv-bench loop` by hand, prompt 1 (token ids)
        trace = os.path.join(res, "loop-traces", "fortune-0001.h5")
        with h5py.File(trace, "r") as f:
            ids = [int(i) for i in f["tokens/ids"][:]]
            P = int(f.attrs["prompt_len"])
        expect(ids[:P] == [256, 78, 101, 118, 101, 114] and len(ids) == P + S,
               f"trace of prompt 1: the prompt ids, then {S} decode positions")
        series = os.path.join(tmp, "series.tsv")
        r = run([exe, "loop", "--model", model + "/model.bin", "--prompt-ids",
                 "256,78,101,118,101,114", "--steps", str(S), "--codec", "uniform", "--set",
                 "bits=2", "--set", "n_b=4", "--series", series])
        expect(r.returncode == 0, f"fadkv-bench loop runs {r.stderr[-200:]}")
        tab = list(csv.DictReader(open(series), delimiter="\t"))
        greedy = [int(t["token_greedy"]) for t in tab]
        expect(greedy[:-1] == ids[P + 1:], "the trace's decode is the loop's greedy reference")
        with h5py.File(os.path.join(res, "cells", uni["cell_id"] + ".h5"), "r") as f:
            g = f["T01/loop"]
            same = all(np.allclose(g[k][:], [float(t[c]) for t in tab], rtol=1e-8, atol=1e-12)
                       for k, c in (("kl", "kl"), ("nll_exact", "nll_exact"),
                                    ("nll_codec", "nll_codec"), ("kl_free", "kl_free")))
            same &= list(g["top1"][:]) == [int(t["top1"]) for t in tab]
            same &= list(g["tokens_free"][:]) == [int(t["token_free"]) for t in tab]
        expect(same, "cell HDF5 T01/loop series == fadkv-bench loop --series")
        # an eviction policy of the sweep runs in the loop too: the same as by hand
        expect(len(stream) == 1 and float(stream[0]["e2e_kl"]) > 0,
               "full + streaming (sinks 2, recent 10): a cell with e2e KL > 0")
        r = run([exe, "loop", "--model", model + "/model.bin", "--prompt-ids",
                 "256,78,101,118,101,114", "--steps", str(S), "--codec", "full", "--set",
                 "n_b=0", "--evict", "streaming", "--evict-set", "sinks=2", "--evict-set",
                 "recent=10", "--series", series])
        tab = list(csv.DictReader(open(series), delimiter="\t"))
        with h5py.File(os.path.join(res, "cells", stream[0]["cell_id"] + ".h5"), "r") as f:
            same = np.allclose(f["T01/loop/kl"][:], [float(t["kl"]) for t in tab], rtol=1e-8,
                               atol=1e-12)
        expect(r.returncode == 0 and same,
               "the policy's cell series == fadkv-bench loop --evict streaming --series")
        # the prefill's row rewrites by hand: nothing pruned (a prompt within think_recent)
        # is the exact model; ThinK pruning half the prompt's key channels is not
        kls = {}
        for name, extra in (("none", ["--rewrite-set", "think=0.5", "--rewrite-set",
                                      "think_recent=100"]),
                            ("think", ["--rewrite-set", "think=0.5", "--rewrite-set",
                                       "think_recent=0", "--rewrite-set", "think_window=4"])):
            r = run([exe, "loop", "--model", model + "/model.bin", "--prompt-ids",
                     "256,78,101,118,101,114", "--steps", str(S), "--codec", "full", "--set",
                     "n_b=0", "--series", series] + extra)
            expect(r.returncode == 0, f"fadkv-bench loop --rewrite-set ({name}) runs")
            kls[name] = [float(t["kl"]) for t in csv.DictReader(open(series), delimiter="\t")]
        expect(all(k == 0 for k in kls["none"]) and kls["think"][0] > 0,
               "loop --rewrite-set: nothing pruned is exact (KL 0), ThinK moves the first step")

        # resume, shards + merge, check
        r = run([exe, "--config", cfg])
        expect("0 cell(s) run" in r.stderr and "4 already done" in r.stderr,
               f"a rerun computes nothing: {r.stderr.strip()[-120:]}")
        shards = []
        for i in range(2):
            out = os.path.join(tmp, f"shard{i}")
            r = run([exe, "--config", config(f"s{i}.toml", out), "--quiet", "--shard",
                     f"{i}/2"])
            expect(r.returncode == 0, f"shard {i}/2 runs")
            shards.append(out)
        merged = os.path.join(tmp, "merged")
        r = run([exe, "merge", merged] + shards)
        expect(r.returncode == 0, f"merge {r.stderr[-200:]}")
        keys = ["e2e_kl", "e2e_top1", "e2e_nll_diff", "free_first_diverge", "loop_attn_kl"]
        a = {c["cell_id"]: [c[k] for k in keys] for c in rows(os.path.join(res, "cells.csv"))}
        b = {c["cell_id"]: [c[k] for k in keys] for c in rows(os.path.join(merged, "cells.csv"))}
        expect(a == b, "two shards merged: the single run's closed-loop columns")
        base = os.path.join(tmp, "baseline.csv")
        r = run([exe, "check", "--baseline", base, "--results", res, "--update", "--metrics",
                 "e2e_kl,e2e_top1,loop_attn_kl"])
        expect(r.returncode == 0, f"check --update {r.stderr[-200:]}")
        r = run([exe, "check", "--baseline", base, "--results", res])
        expect(r.returncode == 0, "check passes against its own baseline")
        lines = open(base).read().splitlines()
        hdr = lines[0].split(",")
        col = hdr.index("e2e_kl")
        for i in range(1, len(lines)):
            f = lines[i].split(",")
            if f[hdr.index("codec")] == "uniform":
                f[col] = repr(float(f[col]) * 0.5)
                lines[i] = ",".join(f)
                break
        open(base, "w").write("\n".join(lines) + "\n")
        r = run([exe, "check", "--baseline", base, "--results", res])
        expect(r.returncode == 1, f"check fails on a baseline with half the e2e_kl (exit "
                                  f"{r.returncode})")

        # refusals
        bad = config("bad1.toml", os.path.join(tmp, "bad"), steps=S)
        txt = open(bad).read().replace(f"steps = {S}\n", "")
        open(bad, "w").write(txt)
        r = run([exe, "--config", bad, "--dry-run"])
        expect(r.returncode != 0 and "needs model, prompts and steps" in r.stderr and
               "bad1.toml:" in r.stderr, f"no steps: refused ({r.stderr.strip()[:160]})")
        bad = config("bad2.toml", os.path.join(tmp, "bad"),
                     extra=f'traces = ["{src}/datasets/embedded/fortune-byte-4L-00.h5"]')
        r = run([exe, "--config", bad, "--dry-run"])
        expect(r.returncode != 0 and "has no traces" in r.stderr,
               f"model and traces: refused ({r.stderr.strip()[:160]})")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
