#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the tiny seed files of the fuzz_trace target (tests/fuzz/corpus/trace/).

Traces in format v1 (datasets/README.md) with contiguous datasets and HDF5's earliest file
format (superblock v0), a few KB each: float32 with queries, float16 without queries, bfloat16
stored as int16, one with a NaN, one with ids; plus a dictionary (format v1). Deterministic.
usage: PYENV_VERSION=system python3 make_trace_seeds.py OUT_DIR
"""
import os
import sys

import h5py
import numpy as np


def trace(path, enc="float32", layers=2, hq=2, hkv=1, d=4, prefill=3, decode=3,
          queries=True, ids=True, nan=False):
    rng = np.random.default_rng(len(path))
    T = prefill + decode
    with h5py.File(path, "w", libver="earliest") as f:
        a = f.attrs
        a["schema"] = "fadkv-trace"
        a["schema_version"] = np.int64(1)
        a["model_id"] = "seed"
        a["source"] = "synthetic"
        a["num_layers"] = np.int64(layers)
        a["num_q_heads"] = np.int64(hq)
        a["num_kv_heads"] = np.int64(hkv)
        a["head_dim"] = np.int64(d)
        a["keys_post_rope"] = np.int64(1)
        a["prompt_len"] = np.int64(prefill)
        a["rope_theta"] = 10000.0
        a["prompt"] = "seed prompt"
        f["tokens/positions"] = np.arange(T, dtype=np.int32)
        f["tokens/phase"] = np.array([0] * prefill + [1] * decode, dtype=np.uint8)
        if ids:
            f["tokens/ids"] = np.arange(T, dtype=np.int32) + 5
        for l in range(layers):
            g = f.create_group(f"layers/L{l:02d}")
            arrs = {"keys": (hkv, T), "values": (hkv, T)}
            if queries:
                arrs["queries"] = (hq, T)
            for name, (h, rows) in arrs.items():
                x = rng.standard_normal((h, rows, d)).astype(np.float32)
                if nan and l == 1 and name == "keys":
                    x[0, 2, 1] = np.nan
                if enc == "float32":
                    ds = g.create_dataset(name, data=x)
                elif enc == "float16":
                    ds = g.create_dataset(name, data=x.astype(np.float16))
                else:
                    bits = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
                    ds = g.create_dataset(name, data=bits)
                ds.attrs["encoding"] = enc
            if queries:
                g["query_token_idx"] = np.arange(T, dtype=np.int32)


def dictionary(path, layers=2, d=4, n=6):
    rng = np.random.default_rng(7)
    with h5py.File(path, "w", libver="earliest") as f:
        f.attrs["schema"] = "fadkv-dict"
        f.attrs["schema_version"] = np.int64(1)
        f.attrs["num_layers"] = np.int64(layers)
        f.attrs["head_dim"] = np.int64(d)
        f.attrs["atoms"] = np.int64(n)
        for l in range(layers):
            for kind in ("keys", "values"):
                x = rng.standard_normal((n, d)).astype(np.float32)
                x /= np.linalg.norm(x, axis=1, keepdims=True)
                f[f"layers/L{l:02d}/{kind}"] = x


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    trace(f"{out}/f32-queries.h5")
    trace(f"{out}/f16-noqueries.h5", enc="float16", queries=False, ids=False, layers=1)
    trace(f"{out}/bf16-gqa.h5", enc="bfloat16", hq=4, hkv=2, prefill=2, decode=2)
    trace(f"{out}/nan.h5", nan=True)
    dictionary(f"{out}/dict.h5")


if __name__ == "__main__":
    main()
