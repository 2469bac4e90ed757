#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Cross-check `fadkv-bench bench omp` against scikit-learn's orthogonal_mp_gram.

Run as:  PYENV_VERSION=system python3 tests/sklearn_omp.py --bench build/fadkv-bench

1. `bench omp --dump` writes a random unit-norm dictionary and structured signals (HDF5).
2. `bench omp --input ... --codes-out ...` codes them (Gram mode) and records vectors/s.
3. sklearn.linear_model.orthogonal_mp_gram codes a subset from the same Gram and X^T y
   (float64), timed in this process.
4. Checks: supports identical as sets on >= 99.9 % of the subset, and relative errors
   ||x - D c|| / ||x|| equal to 1e-5 where supports agree. Prints the speed ratio measured
   in this run. Exit 0 = pass, 1 = fail, 77 = skipped (numpy/h5py/sklearn missing).
5. With --lexico-src DIR (a checkout of krafton-ai/lexico, read from there at run time and
   never copied here): Lexico's own batched coder, lexico/omp.py omp_v0 (torch on the CPU,
   float32, one batch of the same signals against the same Gram, --torch-threads threads),
   timed in this process, its supports compared with ours; the ratio is printed, not gated.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--bench", required=True, help="path of the fadkv-bench binary")
    ap.add_argument("--atoms", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--sparsity", type=int, default=8)
    ap.add_argument("--signals", type=int, default=16384, help="signals coded by fadkv-bench")
    ap.add_argument("--sk-signals", type=int, default=1000,
                    help="subset coded by sklearn (it copies the Gram per target)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="fadkv-bench worker threads")
    ap.add_argument("--lexico-src", help="a checkout of krafton-ai/lexico: time its omp_v0 too")
    ap.add_argument("--lexico-signals", type=int, default=4096,
                    help="signals coded by Lexico's omp_v0 in one batch")
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()

    try:
        import h5py
        import numpy as np
        from sklearn.linear_model import orthogonal_mp_gram
    except ImportError as e:
        print(f"SKIP: {e} (run with PYENV_VERSION=system python3)")
        return 77

    with tempfile.TemporaryDirectory(prefix="fk_sklearn_omp_") as tmp:
        data = os.path.join(tmp, "data.h5")
        codes = os.path.join(tmp, "codes.h5")
        common = ["bench", "omp", "--atoms", str(args.atoms), "--dim", str(args.dim),
                  "--sparsity", str(args.sparsity), "--signals", str(args.signals),
                  "--seed", str(args.seed)]
        subprocess.run([args.bench] + common + ["--dump", data], check=True,
                       stdout=subprocess.DEVNULL)
        out = subprocess.run([args.bench] + common + [
            "--input", data, "--codes-out", codes, "--threads", str(args.threads),
            "--repeats", "5", "--naive", "0"], check=True, capture_output=True, text=True)
        print(out.stdout, end="")

        with h5py.File(data, "r") as f:
            D = f["dict"][...].astype(np.float64)       # (N, m), atom-major
            X = f["signals"][...].astype(np.float64)    # (n, m)
        with h5py.File(codes, "r") as f:
            idx = f["codes_idx"][...]
            k = f["codes_k"][...]
            err2 = f["codes_err2"][...]
            xx = f["codes_xx"][...]
            ours_vps = float(f.attrs["vectors_per_s"])

    n = min(args.sk_signals, X.shape[0])
    s = args.sparsity
    gram = D @ D.T
    xy = X[:n] @ D.T                                       # (n, N)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t0 = time.perf_counter()
        coef = orthogonal_mp_gram(gram, xy.T, n_nonzero_coefs=s)   # (N, n)
        t_sk = time.perf_counter() - t0
    sk_vps = n / t_sk

    agree = 0
    worst = 0.0
    for i in range(n):
        sk_sup = set(np.flatnonzero(coef[:, i]).tolist())
        our_sup = set(idx[i, :k[i]].tolist())
        if sk_sup != our_sup:
            continue
        agree += 1
        r = X[i] - coef[:, i] @ D
        e_sk = np.linalg.norm(r) / np.linalg.norm(X[i])
        e_ours = np.sqrt(err2[i] / xx[i])
        worst = max(worst, abs(e_ours - e_sk))
    frac = agree / n
    print(f"sklearn orthogonal_mp_gram: {n} signals in {t_sk:.2f} s = {sk_vps:.1f} vectors/s")
    print(f"fadkv-bench Gram-mode OMP: {ours_vps:.0f} vectors/s ({args.threads} thread(s), "
          "end to end incl. correlations)")
    print(f"speed ratio fadkv-bench / sklearn: {ours_vps / sk_vps:.0f}x (target >= 50x)")
    print(f"supports identical as sets: {agree} / {n} = {100 * frac:.3f}% (target >= 99.9%)")
    print(f"max |relative error ours - sklearn| on agreeing supports: {worst:.2e} "
          "(target <= 1e-5)")
    ok = frac >= 0.999 and worst <= 1e-5
    if args.lexico_src:
        lexico_side_by_side(args, D, X, idx, k, ours_vps)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def lexico_side_by_side(args, D, X, idx, k, ours_vps):
    """Lexico's omp_v0 on the same dictionary and signals, timed here (torch, CPU)."""
    import numpy as np
    import torch
    sys.path.insert(0, os.path.abspath(args.lexico_src))
    from lexico.omp import omp_v0   # the user's checkout, never vendored
    torch.set_num_threads(args.torch_threads)
    n = min(args.lexico_signals, X.shape[0])
    s = args.sparsity
    Dt = torch.from_numpy(D.T.astype(np.float32)).unsqueeze(0)          # (1, m, N)
    y = torch.from_numpy(X[:n].astype(np.float32)).unsqueeze(0)         # (1, n, m)
    with torch.no_grad():
        xtx = torch.bmm(Dt.transpose(1, 2), Dt)                         # once, as Lexico
        omp_v0(Dt, y[:, :8], xtx, n_nonzero_coefs=s)                    # warm-up
        t0 = time.perf_counter()
        sets = omp_v0(Dt, y, xtx, n_nonzero_coefs=s)[0][0].numpy()      # (n, s)
        t_lx = time.perf_counter() - t0
    lx_vps = n / t_lx
    agree = sum(set(sets[i].tolist()) == set(idx[i, :k[i]].tolist()) for i in range(n))
    print(f"Lexico omp_v0 (torch {torch.__version__}, {args.torch_threads} thread(s), float32): "
          f"{n} signals in {t_lx:.2f} s = {lx_vps:.0f} vectors/s")
    print(f"speed ratio fadkv-bench / Lexico omp_v0: {ours_vps / lx_vps:.2f}x; supports "
          f"identical as sets: {agree} / {n} = {100 * agree / n:.2f}%")


if __name__ == "__main__":
    sys.exit(main())
