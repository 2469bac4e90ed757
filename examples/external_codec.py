#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A KV-cache codec prototyped in NumPy, evaluated by fadkv-bench (codec `external`).

Your prototype reads a trace, computes what its cache would hold for every key and value,
and writes those reconstructions into a file laid out like the trace (same schema, shapes
and tokens; only /layers/Lxx/keys and /layers/Lxx/values differ). fadkv-bench's `external`
codec then replays them: reconstruction error, attention fidelity with the recorded queries,
bytes per token and the cross-family figures, next to every built-in codec
(datasets/EXTERNAL.md).

The prototype here: a per-sequence rank-r SVD of each (layer, kind, KV head) matrix
[T, head_dim] (ShadowKV-style, but for keys and values alike), which stores r fp16
coefficients per vector plus the sequence's r x head_dim fp16 basis, amortised over its
tokens. Replace `reconstruct` by your codec.

usage: external_codec.py --rank R --out DIR TRACE.h5...
  writes DIR/<trace file name> for each trace and prints the sweep lines to evaluate it.
Run with PYENV_VERSION=system python3 (Debian's numpy and h5py).
"""
import argparse
import os
import shutil
import sys

import h5py
import numpy as np


def reconstruct(x, rank):
    """x [T, d] float32 -> its best rank-`rank` approximation (float32)."""
    u, s, vt = np.linalg.svd(x.astype(np.float64), full_matrices=False)
    r = min(rank, len(s))
    return ((u[:, :r] * s[:r]) @ vt[:r]).astype(np.float32)


def stored(ds):
    """A trace dataset as float32, whatever its encoding (float32, float16, bfloat16)."""
    enc = ds.attrs.get("encoding", "float32")
    enc = enc.decode() if isinstance(enc, bytes) else enc
    a = ds[...]
    if enc == "bfloat16":  # the upper 16 bits of a float32
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def write_reconstructions(trace, out, rank):
    """Copies trace to out and replaces its keys and values by their reconstructions."""
    tmp = out + ".tmp"
    shutil.copyfile(trace, tmp)
    with h5py.File(tmp, "r+") as f:
        n_tokens = f["tokens/positions"].shape[0]
        for name in sorted(f["layers"]):
            for kind in ("keys", "values"):
                path = f"layers/{name}/{kind}"
                x = stored(f[path])                       # [H_kv, T, d]
                rec = np.stack([reconstruct(x[h], rank) for h in range(x.shape[0])])
                chunks = f[path].chunks
                del f[path]
                d = f.create_dataset(path, data=rec, dtype="float32", chunks=chunks)
                d.attrs["encoding"] = "float32"
        f.attrs["external_codec"] = f"per-sequence rank-{rank} SVD (examples/external_codec.py)"
        head_dim = f["layers/L00/keys"].shape[2]
    os.replace(tmp, out)
    # the prototype's own accounting: r fp16 coefficients per vector, plus the sequence's
    # r x head_dim fp16 basis spread over its tokens
    return 2.0 * rank + 2.0 * rank * head_dim / n_tokens


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    per_vec = []
    for t in a.traces:
        per_vec.append(write_reconstructions(t, os.path.join(a.out, os.path.basename(t)),
                                             a.rank))
    mean = sum(per_vec) / len(per_vec)
    print(f"wrote {len(a.traces)} reconstruction file(s) to {a.out}; evaluate them with:")
    print(f'  [[dataset]] ... reconstructions = "{a.out}"')
    print(f'  [[codec]] name = "external"  n_b = 0  bytes_per_vector = {mean:.6g}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
