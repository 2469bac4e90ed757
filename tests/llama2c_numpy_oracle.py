#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Independent float64 NumPy oracle for the llama2.c runner behind `fadkv-bench trace`.

Written from the format description in the shared models README (not from any runner):
reads model.bin and tokenizer.bin, encodes the prompt with its own greedy BPE, runs a
token-by-token forward pass with a KV cache in float64, and compares with what the C
runner produced for the same prompt:
  - token ids of the prompt (exact),
  - logits of every fed token (hidden --dump-logits output), criterion: max absolute
    difference <= 1e-4 (logit magnitudes are O(10), so this is also < 1e-5 relative),
  - post-RoPE keys, values and queries of every layer in the trace (float32 encoding),
    criterion: max absolute difference <= 1e-4,
  - greedy continuation: each generated id is the argmax of the oracle's logits.

usage: llama2c_numpy_oracle.py FADKV_BENCH_EXE
Exits 77 (skip) when numpy/h5py, the models or the `trace` command are missing.
"""
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
TOL = 1e-4
CASES = [  # (model folder, prompt, steps)
    ("babyllama-tok105", "Once upon a time", 12),
    ("aidreams-260k", "", 12),
    ("fortune-byte-4L", "The meaning of life ", 12),
]

try:
    import numpy as np
    import h5py
except ImportError as e:  # pragma: no cover
    print(f"skip: {e} (run with PYENV_VERSION=system python3)")
    sys.exit(SKIP)


def load_model(path):
    raw = open(path, "rb").read()
    dim, hid, L, H, KV, V, S = struct.unpack("<7i", raw[:28])
    shared = V > 0
    V = abs(V)
    hd = dim // H
    kvd = KV * hd
    shapes = [("emb", (V, dim)), ("rms_att", (L, dim)), ("wq", (L, dim, dim)),
              ("wk", (L, kvd, dim)), ("wv", (L, kvd, dim)), ("wo", (L, dim, dim)),
              ("rms_ffn", (L, dim)), ("w1", (L, hid, dim)), ("w2", (L, dim, hid)),
              ("w3", (L, hid, dim)), ("rms_final", (dim,)), ("fr", (S, hd // 2)),
              ("fi", (S, hd // 2))]
    if not shared:
        shapes.append(("wcls", (V, dim)))
    flat = np.frombuffer(raw, dtype="<f4", offset=28).astype(np.float64)
    w, off = {}, 0
    for name, shp in shapes:
        n = int(np.prod(shp))
        w[name] = flat[off:off + n].reshape(shp)
        off += n
    if off != flat.size:
        raise SystemExit(f"{path}: floats from the header {off} != file floats {flat.size}")
    if shared:
        w["wcls"] = w["emb"]
    cfg = dict(dim=dim, hid=hid, L=L, H=H, KV=KV, V=V, S=S, hd=hd, kvd=kvd)
    return cfg, w


def load_tokenizer(path):
    raw = open(path, "rb").read()
    off = 4
    pieces, scores = [], []
    while off < len(raw):
        sc, n = struct.unpack("<fi", raw[off:off + 8])
        off += 8
        pieces.append(raw[off:off + n])
        scores.append(sc)
        off += n
    return pieces, scores


def encode(pieces, scores, text):
    index = {}
    for i, p in enumerate(pieces):
        index.setdefault(p, i)
    byte_level = all(bytes([b]) in index for b in range(256))
    ids = [index[b"\n<s>\n"]]
    if text and not byte_level and b" " in index:
        ids.append(index[b" "])
    for ch in text:
        cb = ch.encode("utf-8")
        if cb in index:
            ids.append(index[cb])
            continue
        for b in cb:
            hexp = b"<0x%02X>" % b
            ids.append(index[hexp] if hexp in index else index[bytes([b])])
    while True:
        best = None
        for i in range(len(ids) - 1):
            m = pieces[ids[i]] + pieces[ids[i + 1]]
            if m in index and (best is None or scores[index[m]] > best[0]):
                best = (scores[index[m]], i, index[m])
        if best is None:
            return ids
        _, i, j = best
        ids[i:i + 2] = [j]


def rmsnorm(x, g):
    return g * x / np.sqrt(np.mean(x * x) + 1e-5)


def rope(v, pos, hd):
    """v: [heads, hd]; rotate pairs (2i, 2i+1) by pos * 10000^(-2i/hd)."""
    i = np.arange(hd // 2, dtype=np.float64)
    ang = pos * 10000.0 ** (-2.0 * i / hd)
    c, s = np.cos(ang), np.sin(ang)
    a, b = v[:, 0::2].copy(), v[:, 1::2].copy()
    out = np.empty_like(v)
    out[:, 0::2] = a * c - b * s
    out[:, 1::2] = a * s + b * c
    return out


def forward_all(cfg, w, ids):
    L, H, KV, hd, dim = cfg["L"], cfg["H"], cfg["KV"], cfg["hd"], cfg["dim"]
    T = len(ids)
    K = np.zeros((L, KV, T, hd))
    Vc = np.zeros((L, KV, T, hd))
    Q = np.zeros((L, H, T, hd))
    logits = np.zeros((T, cfg["V"]))
    grp = H // KV
    for t, tok in enumerate(ids):
        x = w["emb"][tok].copy()
        for l in range(L):
            xb = rmsnorm(x, w["rms_att"][l])
            q = rope((w["wq"][l] @ xb).reshape(H, hd), t, hd)
            k = rope((w["wk"][l] @ xb).reshape(KV, hd), t, hd)
            v = (w["wv"][l] @ xb).reshape(KV, hd)
            K[l, :, t], Vc[l, :, t], Q[l, :, t] = k, v, q
            out = np.zeros((H, hd))
            for h in range(H):
                kh = K[l, h // grp, :t + 1]
                sc = kh @ q[h] / np.sqrt(hd)
                p = np.exp(sc - sc.max())
                p /= p.sum()
                out[h] = p @ Vc[l, h // grp, :t + 1]
            x = x + w["wo"][l] @ out.reshape(dim)
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1 = w["w1"][l] @ xb
            h3 = w["w3"][l] @ xb
            x = x + w["w2"][l] @ (h1 / (1.0 + np.exp(-h1)) * h3)
        logits[t] = w["wcls"] @ rmsnorm(x, w["rms_final"])
    return K, Vc, Q, logits


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    exe = sys.argv[1]
    shared = os.environ.get("FK_SHARED", "/work/shared")
    models = os.path.join(shared, "data", "models")
    if not os.path.isdir(models):
        print(f"skip: {models} absent")
        return SKIP
    probe = subprocess.run([exe, "trace", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"skip: `{exe} trace` is not available (exit {probe.returncode})")
        return SKIP
    worst_logit = worst_kvq = 0.0
    failed = False
    with tempfile.TemporaryDirectory(prefix="fk_oracle_") as tmp:
        for name, prompt, steps in CASES:
            mp = os.path.join(models, name, "model.bin")
            tp = os.path.join(models, name, "tokenizer.bin")
            out = os.path.join(tmp, name)
            lg = os.path.join(tmp, name + ".logits")
            cmd = [exe, "trace", "--model", mp, "--tokenizer", tp, "--prompt", prompt,
                   "--steps", str(steps), "--out", out, "--dump-logits", lg, "--quiet",
                   "--encoding", "float32"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {name}: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
                return 1
            cfg, w = load_model(mp)
            pieces, scores = load_tokenizer(tp)
            f = h5py.File(os.path.join(out, f"{name}-00.h5"), "r")
            ids = [int(i) for i in f["tokens/ids"][:]]
            P = int(f.attrs["prompt_len"])
            mine = encode(pieces, scores, prompt)
            if ids[:P] != mine:
                print(f"FAIL {name}: prompt ids {ids[:P]} != oracle {mine}")
                failed = True
            K, Vc, Q, logits = forward_all(cfg, w, ids)
            c_logits = np.fromfile(lg, dtype="<f4").reshape(len(ids), cfg["V"])
            d_log = float(np.max(np.abs(c_logits - logits)))
            rel = d_log / float(np.max(np.abs(logits)))
            d_kvq = 0.0
            for l in range(cfg["L"]):
                g = f[f"layers/L{l:02d}"]
                for ds, ref in (("keys", K[l]), ("values", Vc[l]), ("queries", Q[l])):
                    d_kvq = max(d_kvq, float(np.max(np.abs(g[ds][:] - ref))))
            argmax_ok = all(int(np.argmax(logits[t - 1])) == ids[t] for t in range(P, len(ids)))
            ok = d_log <= TOL and d_kvq <= TOL and argmax_ok
            failed |= not ok
            worst_logit, worst_kvq = max(worst_logit, d_log), max(worst_kvq, d_kvq)
            print(f"{'ok  ' if ok else 'FAIL'} {name}: T={len(ids)} P={P} max|dlogit|="
                  f"{d_log:.3e} (relative to max|logit| {rel:.3e}) max|dK,dV,dQ|={d_kvq:.3e} "
                  f"greedy ids = oracle argmax: {argmax_ok}")
            f.close()
    print(f"worst max|dlogit| {worst_logit:.3e}, worst max|dK/dV/dQ| {worst_kvq:.3e}, "
          f"tolerance {TOL} (absolute)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
