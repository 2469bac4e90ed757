#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""datasets/export_hf_llama2c.py against a torch reference of the Hugging Face Llama forward
pass written here (rotate_half RoPE with llama3 rope scaling, grouped-query attention,
SwiGLU, untied lm_head), with random weights; no transformers package.

  - the exporter writes the same bytes from a torch state dict and from a .safetensors
    directory (written here, float32);
  - the C runner on the export (`fadkv-bench loop --codec full --dump-logits`, which feeds
    given ids) gives the reference's logits at every position to 1e-4 (float32 vs float64),
    so the q/k row interleave, the RoPE tables read from the checkpoint (theta 500000 and a
    llama3 scaling, not the runner's default) and the weight order are right;
  - an export without the q/k interleave does not (the test can fail).

usage: test_hf_export.py FADKV_BENCH_EXE SRCDIR      exits 77 (skip) without torch.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(SKIP)

TOL = 1e-4
CFG = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=97, rms_norm_eps=1e-5, rope_theta=500000.0,
           rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16),
           tie_word_embeddings=False, max_position_embeddings=64)


def random_state(cfg, seed=7):
    g = torch.Generator().manual_seed(seed)
    d, h, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, KV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    hd = d // H
    r = lambda *s, sc=0.2: (torch.randn(*s, generator=g, dtype=torch.float64) * sc)
    sd = {"model.embed_tokens.weight": r(V, d, sc=1.0), "model.norm.weight": 1 + r(d, sc=0.1),
          "lm_head.weight": r(V, d)}
    for l in range(L):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = 1 + r(d, sc=0.1)
        sd[p + "post_attention_layernorm.weight"] = 1 + r(d, sc=0.1)
        sd[p + "self_attn.q_proj.weight"] = r(H * hd, d)
        sd[p + "self_attn.k_proj.weight"] = r(KV * hd, d)
        sd[p + "self_attn.v_proj.weight"] = r(KV * hd, d)
        sd[p + "self_attn.o_proj.weight"] = r(d, H * hd)
        sd[p + "mlp.gate_proj.weight"] = r(h, d)
        sd[p + "mlp.up_proj.weight"] = r(h, d)
        sd[p + "mlp.down_proj.weight"] = r(d, h)
    # the export is float32: the reference runs on the same float32 values, in float64
    return {k: v.float().double() for k, v in sd.items()}


def llama3_inv_freq(cfg, hd):
    """Hugging Face's llama3 rope scaling of the default inverse frequencies (torch)."""
    base = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    s = cfg["rope_scaling"]
    lo_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    hi_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for f in base.tolist():
        wl = 2 * 3.141592653589793 / f
        if wl < hi_wl:
            out.append(f)
        elif wl > lo_wl:
            out.append(f / s["factor"])
        else:
            sm = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            out.append((1 - sm) * f / s["factor"] + sm * f)
    return torch.tensor(out, dtype=torch.float64)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rms(x, w, eps):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def hf_forward(sd, cfg, ids):
    """Logits [T, V] of the Hugging Face Llama computation, float64, causal, no cache."""
    d, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, T, eps = d // H, len(ids), cfg["rms_norm_eps"]
    pos = torch.arange(T, dtype=torch.float64)
    fr = torch.outer(pos, llama3_inv_freq(cfg, hd))
    emb = torch.cat((fr, fr), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = sd["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, sd[p + "input_layernorm.weight"], eps)
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(T, H, hd).transpose(0, 1)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(T, KV, hd).transpose(0, 1)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(T, KV, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        a = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, dim=-1)
        o = (a @ v).transpose(0, 1).reshape(T, d)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"], eps)
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        up = h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["model.norm.weight"], eps) @ sd["lm_head.weight"].T


def write_safetensors(path, sd):
    header, blobs, off = {}, [], 0
    for k, v in sd.items():
        b = v.float().numpy().astype("<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def c_logits(exe, model, ids, P, S, tmp):
    out = os.path.join(tmp, "logits.f32")
    cmd = [exe, "loop", "--model", model, "--prompt-ids", ",".join(map(str, ids[:P])),
           "--continuation-ids", ",".join(map(str, ids[P:P + S + 1])), "--steps", str(S),
           "--codec", "full", "--dump-logits", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return np.fromfile(out, dtype="<f4").reshape(S, -1)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    exe, src = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(src, "datasets"))
    import export_hf_llama2c as ex
    sd = random_state(CFG)
    rng = np.random.default_rng(3)
    ids = [int(i) for i in rng.integers(0, CFG["vocab_size"], size=40)]
    P, S = 6, 33
    ref = hf_forward(sd, CFG, ids).numpy()
    failed = False
    with tempfile.TemporaryDirectory(prefix="fk_hf_export_") as tmp:
        torch.save({k: v.float() for k, v in sd.items()}, os.path.join(tmp, "sd.pt"))
        json.dump(CFG, open(os.path.join(tmp, "config.json"), "w"))
        mdir = os.path.join(tmp, "hf")
        os.mkdir(mdir)
        json.dump(CFG, open(os.path.join(mdir, "config.json"), "w"))
        write_safetensors(os.path.join(mdir, "model.safetensors"), sd)
        a, b = os.path.join(tmp, "a.bin"), os.path.join(tmp, "b.bin")
        tool = os.path.join(src, "datasets", "export_hf_llama2c.py")
        for args in (["--state-dict", os.path.join(tmp, "sd.pt"), "--config",
                      os.path.join(tmp, "config.json"), "--out", a],
                     ["--model-dir", mdir, "--out", b]):
            r = subprocess.run([sys.executable, tool, "--seq-len", "64"] + args,
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL exporter {args}: {r.stderr}")
                return 1
        same = open(a, "rb").read() == open(b, "rb").read()
        print(f"{'ok  ' if same else 'FAIL'} state dict and .safetensors exports are the same "
              f"bytes")
        failed |= not same
        got = c_logits(exe, a, ids, P, S, tmp)
        d = float(np.abs(got - ref[P:P + S]).max())
        ok = d <= TOL
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} C runner on the export vs the torch HF reference: "
              f"max |dlogit| {d:.3e} over {S} positions (tolerance {TOL}; max |logit| "
              f"{np.abs(ref).max():.2f})")
        # the test can fail: without the q/k interleave the export computes something else
        keep = ex.interleave
        ex.interleave = lambda w, heads, hd: w
        bad = os.path.join(tmp, "bad.bin")
        ex.export({k: v.float().numpy() for k, v in sd.items()}, CFG, bad, 64)
        ex.interleave = keep
        d_bad = float(np.abs(c_logits(exe, bad, ids, P, S, tmp) - ref[P:P + S]).max())
        ok = d_bad > 100 * TOL
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} an export without the q/k interleave differs: "
              f"max |dlogit| {d_bad:.3e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
