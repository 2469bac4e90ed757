#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Independent float64 NumPy closed loop for `fadkv-bench loop` with the `uniform` codec and
the `streaming` eviction policy.

Written from the protocol text (core/fk_codec.h, enum fk_buf_mode SLIDE; spec algorithms.md
section 4), not from harness/loop: the llama2.c forward pass of tests/llama2c_numpy_oracle.py
in float64, token by token, whose K/V cache rows are replaced by the uniform quantiser's
reconstruction (tests/quant_numpy_oracle.py's per-row grid: 2^bits levels from the row's
min to max, origin and step in fp16) once the buffer hands them over:
  - prefill: rows 0 .. P-n_b-1 after the prompt's last forward pass,
  - decode position t (after its attention): the oldest min(a_len, held) buffered rows when
    held = t - compressed >= n_b and held > 0.
The teacher ids are the oracle's own exact greedy decode (passed as --continuation-ids).
The C loop runs teacher forcing one position per forward pass and, without an eviction
policy, again in blocks of up to 16 positions (--block 16); both meet the criterion.
Criterion: per step, |KL_C - KL_oracle| <= 1e-4 for KL(P_exact || P_codec) of the next-token
distribution, and the top-1 agreement of both is the same at every step where the oracle's
exact and closed-loop top-2 logits are at least 1e-3 apart.

usage: loop_numpy_oracle.py FADKV_BENCH_EXE
Exits 77 (skip) when numpy or the models are missing.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SKIP = 77
TOL = 1e-4
CASES = [  # (model, prompt, steps, bits, n_b, a_len[, (sinks, recent)])
    ("fortune-byte-4L", "The meaning of life ", 60, 3, 8, 2),
    ("fortune-byte-4L", "You will be", 50, 2, 0, 1),
    ("fortune-hd128", "Never trust a computer", 50, 3, 6, 3),   # head_dim 128, GQA 3
    # the streaming eviction policy over the exact cache (codec full, every row handed over):
    # decode position t attends to tokens [0, sinks) and [t+1-recent, t] only
    ("fortune-byte-4L", "Never trust a computer", 50, None, 0, 1, (4, 12)),
    ("fortune-hd128", "You will be", 40, 3, 4, 1, (2, 20)),     # uniform + streaming
]

try:
    import numpy as np
    from llama2c_numpy_oracle import load_model, load_tokenizer, encode, rmsnorm, rope
    from quant_numpy_oracle import quant_last
except ImportError as e:  # pragma: no cover
    print(f"skip: {e} (run with PYENV_VERSION=system python3)")
    sys.exit(SKIP)


def decode(cfg, w, ids, P, S, bits=None, n_b=0, a_len=1, window=None):
    """Feeds ids[0 .. P+S-1] (ids grows with the argmax when shorter: greedy); returns the
    logits of positions P .. P+S-1. bits: None = exact cache, else the uniform codec.
    window (sinks, recent): StreamingLLM's kept set at decode positions."""
    L, H, KV, hd, dim = cfg["L"], cfg["H"], cfg["KV"], cfg["hd"], cfg["dim"]
    T = P + S
    K = np.zeros((L, KV, T, hd))
    Vc = np.zeros((L, KV, T, hd))
    Kx, Vx = K.copy(), Vc.copy()  # the rows as computed, before any compression
    grp = H // KV
    comp = 0
    out_logits = np.zeros((S, cfg["V"]))

    def hand_over(a, b):
        for cache, raw in ((K, Kx), (Vc, Vx)):
            cache[:, :, a:b] = quant_last(raw[:, :, a:b].astype(np.float32), bits)

    for t in range(T):
        x = w["emb"][ids[t]].copy()
        for l in range(L):
            xb = rmsnorm(x, w["rms_att"][l])
            q = rope((w["wq"][l] @ xb).reshape(H, hd), t, hd)
            k = rope((w["wk"][l] @ xb).reshape(KV, hd), t, hd)
            v = (w["wv"][l] @ xb).reshape(KV, hd)
            K[l, :, t], Vc[l, :, t] = k, v
            Kx[l, :, t], Vx[l, :, t] = k, v
            o = np.zeros((H, hd))
            vis = np.arange(t + 1)
            if window and t >= P and t + 1 > window[0] + window[1]:
                vis = vis[(vis < window[0]) | (vis >= t + 1 - window[1])]
            for h in range(H):
                sc = K[l, h // grp, vis] @ q[h] / np.sqrt(hd)
                p = np.exp(sc - sc.max())
                o[h] = (p / p.sum()) @ Vc[l, h // grp, vis]
            x = x + w["wo"][l] @ o.reshape(dim)
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1, h3 = w["w1"][l] @ xb, w["w3"][l] @ xb
            x = x + w["w2"][l] @ (h1 / (1.0 + np.exp(-h1)) * h3)
        z = w["wcls"] @ rmsnorm(x, w["rms_final"])
        if t >= P - 1 and len(ids) == t + 1:
            ids.append(int(np.argmax(z)))
        if t >= P:
            out_logits[t - P] = z
        if bits is None:
            continue
        if t == P - 1 and P > n_b:
            hand_over(0, P - n_b)
            comp = P - n_b
        elif t >= P:
            held = t - comp
            if held >= n_b and held > 0:
                ne = min(a_len, held)
                hand_over(comp, comp + ne)
                comp += ne
    return out_logits


def kl(p, q):
    lp = p - p.max()
    lp -= np.log(np.exp(lp).sum())
    lq = q - q.max()
    lq -= np.log(np.exp(lq).sum())
    return float((np.exp(lp) * (lp - lq)).sum())


def margin(z):
    s = np.sort(z)
    return s[-1] - s[-2]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    exe = sys.argv[1]
    models = os.path.join(os.environ.get("FK_SHARED", "/work/shared"), "data", "models")
    if not os.path.isdir(models):
        print(f"skip: {models} absent")
        return SKIP
    failed = False
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="fk_loop_oracle_") as tmp:
        for case in CASES:
            name, prompt, S, bits, n_b, a_len = case[:6]
            window = case[6] if len(case) > 6 else None
            mp = os.path.join(models, name, "model.bin")
            tp = os.path.join(models, name, "tokenizer.bin")
            if not os.path.exists(mp):
                print(f"skip: {mp} absent")
                return SKIP
            cfg, w = load_model(mp)
            pieces, scores = load_tokenizer(tp)
            ids = encode(pieces, scores, prompt)
            P = len(ids)
            exact = decode(cfg, w, ids, P, S)  # greedy: ids grows to P + S + 1
            mine = decode(cfg, w, list(ids), P, S, bits, n_b, a_len, window)
            # teacher forcing one position per pass, and (without a policy) in blocks
            for block in [None] if window else [None, 16]:
                series = os.path.join(tmp, "series.tsv")
                cmd = [exe, "loop", "--model", mp, "--prompt-ids", ",".join(map(str, ids[:P])),
                       "--continuation-ids", ",".join(map(str, ids[P:P + S + 1])),
                       "--steps", str(S), "--series", series]
                cmd += ["--block", str(block)] if block else []
                cmd += (["--codec", "full", "--set", f"n_b={n_b}"] if bits is None else
                        ["--codec", "uniform", "--set", f"bits={bits}", "--set", f"n_b={n_b}",
                         "--set", f"a_len={a_len}"])
                if window:
                    cmd += ["--evict", "streaming", "--evict-set", f"sinks={window[0]}",
                            "--evict-set", f"recent={window[1]}"]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAIL {name}: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
                    return 1
                rows = [l.split("\t") for l in open(series).read().splitlines()]
                col = {c: i for i, c in enumerate(rows[0])}
                rows = rows[1:]
                d_max, top_bad, kl_sum = 0.0, [], 0.0
                for j in range(S):
                    k_or = kl(exact[j], mine[j])
                    k_c = float(rows[j][col["kl"]])
                    kl_sum += k_or
                    d_max = max(d_max, abs(k_c - k_or))
                    agree = int(np.argmax(exact[j]) == np.argmax(mine[j]))
                    clear = margin(exact[j]) > 1e-3 and margin(mine[j]) > 1e-3
                    if clear and agree != int(rows[j][col["top1"]]):
                        top_bad.append(j)
                ok = d_max <= TOL and not top_bad and kl_sum > 0
                failed |= not ok
                worst = max(worst, d_max)
                what = "full" if bits is None else f"uniform bits={bits}"
                what += f" streaming sinks={window[0]} recent={window[1]}" if window else ""
                what += f" in blocks of {block}" if block else ""
                print(f"{'ok  ' if ok else 'FAIL'} {name} {what} n_b={n_b} "
                      f"a_len={a_len}: P={P} S={S} mean KL {kl_sum / S:.4e}, max |KL_C - "
                      f"KL_oracle| {d_max:.3e}, top-1 disagreements {top_bad}")
    print(f"worst max |dKL| {worst:.3e}, tolerance {TOL}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
