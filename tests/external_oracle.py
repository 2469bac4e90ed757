#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The external codec end to end (codecs/baseline/fk_external.c, datasets/EXTERNAL.md):
examples/external_codec.py writes rank-8 reconstructions of the embedded fortune traces, a
sweep evaluates them with `external`, and the numbers are recomputed here in NumPy from the
trace and reconstruction files:
  - every summary.csv row's rel_err_mean (trace, layer, kind): the mean over the stream's
    coded vectors of ||x - x_hat|| / ||x|| (relative 1e-5: the harness sums in double what
    it reads as float32); with n_b = 0 every token but the newest is coded (the current
    token stays exact, as in every buffer rule),
  - bytes_tok_head: 2 x bytes_per_vector for each coded token and 4 head_dim (fp16 K and V)
    for the newest, per token; bytes_model as given,
  - full-precision window: with n_b = 16 the last 16 tokens of each stream are not coded,
  - refusals before any cell: a missing reconstruction file and one of another shape,
    each naming the file.

usage: external_oracle.py FADKV_BENCH_EXE      (exits 77 without numpy / h5py)
"""
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import h5py
except ImportError as e:  # pragma: no cover
    print(f"skip: {e} (run with PYENV_VERSION=system python3)")
    sys.exit(SKIP)

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "examples"))
import external_codec  # noqa: E402

failures = 0


def check(what, ok):
    global failures
    print(("PASS  " if ok else "FAIL  ") + what)
    failures += 0 if ok else 1


def run(binary, cfg):
    p = subprocess.run([binary, "--config", cfg, "--quiet"], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main():
    binary = os.path.abspath(sys.argv[1])
    traces = sorted(glob.glob(os.path.join(SRC, "datasets/embedded/fortune-byte-4L-*.h5")))
    if not traces:
        print("skip: no embedded fortune traces")
        return SKIP
    w = tempfile.mkdtemp(prefix="fk-external-")
    try:
        rec = os.path.join(w, "rec")
        external_codec.main(["--rank", "8", "--out", rec] + traces)
        bpv = 20.5
        cfg = os.path.join(w, "x.toml")

        def write_cfg(out, n_b, recon=rec):
            with open(cfg, "w") as f:
                f.write(f'[sweep]\nname = "ext"\noutput = "{out}"\nattention = true\n'
                        f'attn_stride = 4\n[[dataset]]\nname = "fortune"\n'
                        f'traces = {traces!r}\nreconstructions = "{recon}"\n'
                        f'[[codec]]\nname = "external"\nn_b = {n_b}\n'
                        f'bytes_per_vector = {bpv}\nbytes_model = 1000\n'.replace("'", '"'))

        out = os.path.join(w, "res")
        write_cfg(out, 0)
        rc, log = run(binary, cfg)
        check(f"the sweep runs (exit {rc})", rc == 0)
        if rc:
            print(log)
            return 1
        worst = 0.0
        n = 0
        for r in rows(os.path.join(out, "summary.csv")):
            t = os.path.join(os.path.dirname(traces[0]), r["trace"])
            kind = "keys" if r["kind"] == "K" else "values"
            with h5py.File(t) as ft, h5py.File(os.path.join(rec, r["trace"])) as fr:
                x = external_codec.stored(ft[f"layers/L{int(r['layer']):02d}/{kind}"])
                y = fr[f"layers/L{int(r['layer']):02d}/{kind}"][...].astype(np.float32)
            x, y = x[:, :-1], y[:, :-1]  # the newest token is never coded with n_b = 0
            xx = np.sqrt((x.astype(np.float64) ** 2).sum(-1))
            err = np.sqrt(((x.astype(np.float64) - y) ** 2).sum(-1))
            keep = xx > 1e-15
            want = float((err[keep] / xx[keep]).mean())
            got = float(r["rel_err_mean"])
            worst = max(worst, abs(got - want) / want)
            n += 1
        check(f"rel_err_mean of {n} streams equals NumPy's (worst relative {worst:.2e})",
              n == 2 * 4 * len(traces) and worst < 1e-5)
        cell = rows(os.path.join(out, "cells.csv"))[0]
        lens = [h5py.File(t)["layers/L00/keys"].shape[1] for t in traces]
        m = h5py.File(traces[0])["layers/L00/keys"].shape[2]
        want_b = sum(2 * bpv * (T - 1) + 4 * m for T in lens) / sum(lens)
        got_b = float(cell["bytes_tok_head"])
        check(f"bytes_tok_head {got_b} = {want_b:.9g} (coded tokens at 2 x bytes_per_vector, "
              "the newest in fp16)", abs(got_b - want_b) < 1e-6 * want_b)
        check(f"bytes_model {cell['bytes_model']} as given", float(cell["bytes_model"]) == 1000)
        check("attention fidelity measured", 0 < float(cell["attn_cos"]) < 1)

        out2 = os.path.join(w, "res16")
        write_cfg(out2, 16)
        rc, log = run(binary, cfg)
        vec = int(rows(os.path.join(out2, "cells.csv"))[0]["vectors"])
        with h5py.File(traces[0]) as f:
            H, T, _ = f["layers/L00/keys"].shape
        want = sum(2 * 4 * H * (h5py.File(t)["layers/L00/keys"].shape[1] - 16) for t in traces)
        check(f"with n_b = 16 the window is not coded ({vec} vectors, expected {want})",
              rc == 0 and vec == want)

        # refusals before any cell: a missing file, one of another shape
        bad = os.path.join(w, "bad")
        os.makedirs(bad)
        shutil.copy(os.path.join(rec, os.path.basename(traces[0])), bad)
        write_cfg(os.path.join(w, "res-missing"), 0, bad)
        rc, log = run(binary, cfg)
        check("a missing reconstruction file is refused, naming it",
              rc != 0 and os.path.basename(traces[1]) in log and
              not os.path.exists(os.path.join(w, "res-missing")))
        other = os.path.join(SRC, "datasets/embedded/aidreams-260k-00.h5")
        shutil.copy(other, os.path.join(bad, os.path.basename(traces[1])))
        write_cfg(os.path.join(w, "res-shape"), 0, bad)
        rc, log = run(binary, cfg)
        check("reconstructions of another shape are refused before any cell",
              rc != 0 and "reconstructions" in log and "but trace" in log and
              not os.path.exists(os.path.join(w, "res-shape", "cells.csv")))
    finally:
        shutil.rmtree(w, ignore_errors=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
