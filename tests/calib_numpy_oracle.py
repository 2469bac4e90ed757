#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""NumPy oracle of `fadkv-bench train-calib` (datasets/CALIB.md) on the embedded calibration
traces of fortune-byte-4L (datasets/embedded/train/).

Those llama2.c traces predate the RoPE attributes, so the test stamps copies with the RoPE
llama2.c applies (rope_layout "interleaved", rope_type "default"; datasets/README.md), runs
train-calib on them, and recomputes everything with h5py and NumPy, written from the rules:
  - keys un-rotated to pre-RoPE here, k_pre = R(-p) k_post with f_i = theta^(-2i/d) and p =
    /tokens/positions, pairs (2i, 2i+1);
  - key thresholds: np.quantile (linear, the default) per channel over every token of both
    traces, at t = 1 - f/2 and 1 - t, cast to numpy.float16: compared exactly;
  - values: each token's row (all KV heads, or one head) by its own np.quantile;
  - LUTs: u = (x - zp) / rg with |u| <= 1, rg > 0, the first `sinks` tokens of each trace left
    out, fitted by a NumPy Lloyd (argmin over every centroid; same init, 50 iterations, stop
    when no assignment changes), sorted: compared within 1e-6.
Also: the untouched traces (no rope_layout) and bad arguments are refused, leaving no file.

usage: calib_numpy_oracle.py FADKV_BENCH_EXE
Exits 77 (skip) when numpy or h5py are missing.
"""
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

SRC = os.environ.get("FK_SRCDIR", os.path.join(os.path.dirname(__file__), ".."))
TRACES = sorted(glob.glob(os.path.join(SRC, "datasets/embedded/train/fortune-byte-4L-*.h5")))
FRACTIONS = [0.0, 0.01, 0.1]
SINKS = 1
LUT_TOL = 1e-6


def unrotate(k, pos, theta):
    """Post-RoPE keys [H, T, d] (interleaved pairs) to pre-RoPE, float64."""
    d = k.shape[-1]
    f = theta ** (-(2.0 * np.arange(d // 2)) / d)
    ang = pos.astype(np.float64)[:, None] * f[None, :]  # [T, d/2]
    cs, sn = np.cos(ang), np.sin(ang)
    a, b = k[..., 0::2], k[..., 1::2]
    out = np.empty_like(k)
    out[..., 0::2] = a * cs + b * sn
    out[..., 1::2] = -a * sn + b * cs
    return out


def lloyd(x, k):
    """1-D Lloyd, brute force: the k sorted levels of the values x."""
    s = np.sort(x)
    n = len(s)
    c = s[np.floor((np.arange(k) + 0.5) * n / k).astype(np.int64)].copy()
    prev = None
    for _ in range(50):
        a = np.argmin(np.abs(s[:, None] - c[None, :]), axis=1)  # first minimum: lower index
        if prev is not None and np.array_equal(a, prev):
            break
        cnt = np.bincount(a, minlength=k)
        tot = np.bincount(a, weights=s, minlength=k)
        c = np.where(cnt > 0, tot / np.maximum(cnt, 1), c)
        prev = a
    return np.sort(c)


def luts(u):
    return {b: lloyd(u, 2 ** b) for b in (2, 3, 4)}


def read_layer(traces, layer):
    """Pre-RoPE keys [N, H d], values [N, H, d] (float64) and the sink mask [N]."""
    ks, vs, sink = [], [], []
    for p in traces:
        with h5py.File(p, "r") as f:
            pos = f["tokens/positions"][:]
            theta = float(f.attrs["rope_theta"])
            k = f[f"layers/L{layer:02d}/keys"][:].astype(np.float64)  # [H, T, d]
            v = f[f"layers/L{layer:02d}/values"][:].astype(np.float64)
        H, T, d = k.shape
        ks.append(unrotate(k, pos, theta).transpose(1, 0, 2).reshape(T, H * d))
        vs.append(v.transpose(1, 0, 2))
        sink.append(np.arange(T) < SINKS)
    return np.concatenate(ks), np.concatenate(vs), np.concatenate(sink)


def normalised(x, up, lo, keep):
    """u of the kept elements inside [-1, 1] (rg > 0)."""
    zp, rg = (up + lo) / 2, (up - lo) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        u = (x - zp) / rg
    m = keep & (rg > 0) & (np.abs(u) <= 1)
    return u[m]


def check_layer(cal, traces, layer, fails):
    K, V, sink = read_layer(traces, layer)
    N, H, d = V.shape
    for fi, f in enumerate(FRACTIONS):
        g = cal[f"layers/L{layer:02d}/kvquant/F{fi}"]
        t = 1 - f / 2
        up = np.quantile(K, t, axis=0).astype(np.float16).astype(np.float64)
        lo = np.quantile(K, 1 - t, axis=0).astype(np.float16).astype(np.float64)
        for name, want in (("keys_upper", up), ("keys_lower", lo)):
            got = g[name][:].astype(np.float64).reshape(-1)
            bad = np.flatnonzero(got != want)
            if bad.size:
                fails.append(f"L{layer:02d} F{fi} {name}: {bad.size} channels differ, first "
                             f"{bad[0]}: {got[bad[0]]!r} vs {want[bad[0]]!r}")
        keep = np.broadcast_to(~sink[:, None], K.shape)
        sets = {"keys": normalised(K, up, lo, keep)}
        rows = V.reshape(N, H * d)
        sets["values_row"] = normalised(rows, np.quantile(rows, t, axis=1)[:, None],
                                        np.quantile(rows, 1 - t, axis=1)[:, None],
                                        np.broadcast_to(~sink[:, None], rows.shape))
        sets["values_head"] = normalised(V, np.quantile(V, t, axis=2)[:, :, None],
                                         np.quantile(V, 1 - t, axis=2)[:, :, None],
                                         np.broadcast_to(~sink[:, None, None], V.shape))
        for sname, u in sets.items():
            for b, want in luts(u).items():
                got = g[f"{sname}_lut{b}"][:].astype(np.float64)
                err = np.max(np.abs(got - want))
                if not err <= LUT_TOL:
                    fails.append(f"L{layer:02d} F{fi} {sname}_lut{b}: {err:.3g} from NumPy "
                                 f"({got} vs {want})")


def run(bench, *args):
    return subprocess.run([bench, "train-calib", *args], capture_output=True, text=True)


def check_refusals(bench, tmp, fails):
    out = os.path.join(tmp, "never.h5")
    cases = [
        (["--out", out, *TRACES], 1, ["rope_layout", TRACES[0]]),
        (["--out", out, "--outliers", "0.6", *TRACES], 2, ["--outliers", "[0, 0.5)"]),
        (["--out", out, "--outliers", "0.01,0", *TRACES], 2, ["--outliers", "ascending"]),
        (["--out", out, "--outliers", "0,x", *TRACES], 2, ["--outliers", "0,x"]),
        (["--out", out, "--sinks", "-1", *TRACES], 2, ["--sinks -1"]),
        ([*TRACES], 2, ["--out"]),
        (["--out", out], 2, ["trace"]),
    ]
    for args, code, words in cases:
        r = run(bench, *args)
        missing = [w for w in words if w not in r.stderr]
        if r.returncode != code or missing:
            fails.append(f"train-calib {' '.join(args)}: exit {r.returncode} (expected {code}), "
                         f"message lacks {missing}: {r.stderr.strip()[:300]}")
    if os.path.exists(out) or os.path.exists(out + ".tmp"):
        fails.append("a refused train-calib left a file behind")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    bench = sys.argv[1]
    if len(TRACES) != 2:
        print(f"FAIL: expected 2 fortune-byte-4L calibration traces, found {TRACES}")
        return 1
    fails = []
    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for p in TRACES:
            q = os.path.join(tmp, os.path.basename(p))
            shutil.copy(p, q)
            with h5py.File(q, "a") as f:
                f.attrs["rope_layout"] = "interleaved"
                f.attrs["rope_type"] = "default"
            copies.append(q)
        out = os.path.join(tmp, "calib.h5")
        r = run(bench, "--out", out, "--outliers", ",".join(str(f) for f in FRACTIONS),
                "--sinks", str(SINKS), *copies)
        if r.returncode != 0 or f"train-calib: wrote {out}" not in r.stdout:
            print(f"FAIL: train-calib exit {r.returncode}: {r.stderr}{r.stdout}")
            return 1
        with h5py.File(out, "r") as cal:
            a = cal.attrs
            n_tok = 0
            for p in copies:
                with h5py.File(p, "r") as f:
                    n_tok += f["tokens/positions"].shape[0]
            if (a["schema"] != "fadkv-calib" or int(a["schema_version"]) != 1
                    or int(a["n_vectors"]) != n_tok or int(a["sinks"]) != SINKS
                    or a["model_id"] != "fortune-byte-4L"
                    or list(cal["kvquant_outliers"][:]) != FRACTIONS
                    or not all(f"{p} sha256:" in a["training_traces"] for p in copies)):
                fails.append(f"attributes: {dict(a)}")
            for layer in range(int(a["n_layers"])):
                check_layer(cal, copies, layer, fails)
        check_refusals(bench, tmp, fails)
    for f in fails:
        print("FAIL:", f)
    if fails:
        return 1
    print(f"PASS: train-calib matches NumPy on {len(TRACES)} traces, fractions {FRACTIONS}, "
          f"sinks {SINKS}: thresholds exact, LUTs within {LUT_TOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
