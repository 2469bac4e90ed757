#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes a Hugging Face Llama-architecture checkpoint as a llama2.c legacy checkpoint
(model.bin) that `fadkv-bench trace`, `loop` and model datasets run, with the token ids of
prompts (the C runner has no tokenizer for Llama 3's tiktoken vocabulary: prompts go in as
ids).

What changes between the two formats (everything else is copied as float32):
  - q_proj and k_proj: Hugging Face rotates half-split pairs (i, i + d/2) of each head
    ("rotate_half"); llama2.c rotates adjacent pairs (2i, 2i+1). The rows of each head are
    interleaved, new row 2i = old row i, new row 2i+1 = old row i + d/2 (the inverse of the
    permutation Hugging Face's convert_llama_weights_to_hf applies). q.k is unchanged: q and
    k are permuted alike; the runner's keys are the Hugging Face keys with that permutation.
  - the RoPE tables freq_cis_real/imag [seq_len, d/2] = cos/sin(pos inv_freq_i), inv_freq
    from rope_theta and rope_scaling (type "llama3": factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings; "default"/absent: none), computed in
    float64; the runner rotates by these tables (fk_llama2c_model_rope_default).
  - gate_proj, up_proj, down_proj are w1, w3, w2; a tied lm_head writes a positive vocab_size.
Refused: rms_norm_eps other than 1e-5 (the runner's), head_dim other than
hidden_size / num_attention_heads, attention or MLP biases, other rope_scaling types.

Input: a directory with config.json and model.safetensors (or model-*.safetensors shards,
bf16/fp16/fp32; read here without the safetensors package), or --state-dict FILE.pt (a
torch.save'd state dict) with --config config.json.

usage:
  export_hf_llama2c.py --model-dir DIR --out model.bin [--seq-len 2048]
                       [--tokenizer-json DIR/tokenizer.json --prompts P.txt --ids-out P.ids]
  export_hf_llama2c.py --state-dict sd.pt --config config.json --out model.bin

--prompts with --tokenizer-json: writes one line of comma-separated token ids per prompt
(BOS first) using the `tokenizers` package when it is installed (it is not needed
otherwise); give those lines to `fadkv-bench loop --prompt-ids` or as a model dataset's
`prompts = [[...], ...]`.
"""
import argparse
import glob
import json
import os
import struct
import sys

import numpy as np


def inv_freq(cfg, hd):
    """The rotary inverse frequencies of a Hugging Face Llama config (float64)."""
    theta = float(cfg.get("rope_theta", 10000.0))
    f = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    sc = cfg.get("rope_scaling") or {}
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind in ("default", None):
        return f
    if kind != "llama3":
        raise SystemExit(f"rope_scaling type {kind!r}: only default and llama3 are exported")
    factor = float(sc["factor"])
    lo, hi = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
    old = float(sc["original_max_position_embeddings"])
    wavelen = 2 * np.pi / f
    lo_wl, hi_wl = old / lo, old / hi
    out = np.where(wavelen > lo_wl, f / factor, f)
    smooth = (old / wavelen - lo) / (hi - lo)
    mid = (1 - smooth) * out / factor + smooth * out
    is_mid = (wavelen >= hi_wl) & (wavelen <= lo_wl)
    return np.where(is_mid, mid, out)


def interleave(w, heads, hd):
    """Rows of each head from half-split order (HF) to adjacent pairs (llama2.c)."""
    rows, cols = w.shape
    assert rows == heads * hd
    return w.reshape(heads, 2, hd // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def read_safetensors(path):
    """{name: float32 array} of one .safetensors file (bf16, f16, f32)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, m in head.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        buf = raw[base + a:base + b]
        dt = m["dtype"]
        if dt == "BF16":
            x = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            x = np.frombuffer(buf, dtype="<f2").astype(np.float32)
        elif dt == "F32":
            x = np.frombuffer(buf, dtype="<f4").astype(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name}: dtype {dt} not handled")
        out[name] = x.reshape(m["shape"])
    return out


def export(sd, cfg, out, seq_len):
    """Writes state dict sd ({name: array}) of Llama config cfg to out (llama2.c legacy)."""
    dim, hid = cfg["hidden_size"], cfg["intermediate_size"]
    L, H = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    V = cfg["vocab_size"]
    hd = dim // H
    if cfg.get("head_dim", hd) != hd:
        raise SystemExit(f"head_dim {cfg['head_dim']} != hidden_size / heads = {hd}")
    if abs(float(cfg.get("rms_norm_eps", 1e-5)) - 1e-5) > 1e-12:
        raise SystemExit(f"rms_norm_eps {cfg['rms_norm_eps']}: the runner uses 1e-5")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise SystemExit("attention or MLP biases: not in the llama2.c format")
    pre = "model." if "model.embed_tokens.weight" in sd else ""
    g = lambda k: np.asarray(sd[pre + k], dtype=np.float32)
    tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in sd
    lay = lambda k: [g(f"layers.{l}.{k}") for l in range(L)]
    parts = [g("embed_tokens.weight")]
    parts += lay("input_layernorm.weight")
    parts += [interleave(w, H, hd) for w in lay("self_attn.q_proj.weight")]
    parts += [interleave(w, KV, hd) for w in lay("self_attn.k_proj.weight")]
    parts += lay("self_attn.v_proj.weight")
    parts += lay("self_attn.o_proj.weight")
    parts += lay("post_attention_layernorm.weight")
    parts += lay("mlp.gate_proj.weight")
    parts += lay("mlp.down_proj.weight")
    parts += lay("mlp.up_proj.weight")
    parts += [g("norm.weight")]
    ang = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq(cfg, hd)[None, :]
    parts += [np.cos(ang), np.sin(ang)]
    if not tied:
        parts.append(np.asarray(sd["lm_head.weight"], dtype=np.float32))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<7i", dim, hid, L, H, KV, V if tied else -V, seq_len))
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype="<f4").tobytes())
    os.replace(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir")
    ap.add_argument("--state-dict")
    ap.add_argument("--config")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--tokenizer-json")
    ap.add_argument("--prompts")
    ap.add_argument("--ids-out")
    a = ap.parse_args()
    if a.model_dir:
        cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
        files = sorted(glob.glob(os.path.join(a.model_dir, "*.safetensors")))
        if not files:
            raise SystemExit(f"{a.model_dir}: no .safetensors files")
        sd = {}
        for p in files:
            sd.update(read_safetensors(p))
    elif a.state_dict and a.config:
        import torch
        cfg = json.load(open(a.config))
        sd = {k: v.float().numpy() for k, v in torch.load(a.state_dict).items()}
    else:
        raise SystemExit("give --model-dir, or --state-dict and --config")
    export(sd, cfg, a.out, a.seq_len)
    print(f"wrote {a.out}")
    if a.prompts:
        from tokenizers import Tokenizer  # only for this step
        tok = Tokenizer.from_file(a.tokenizer_json)
        bos = cfg.get("bos_token_id")
        with open(a.ids_out, "w") as f:
            for line in open(a.prompts):
                line = line.rstrip("\n")
                if not line:
                    continue
                ids = tok.encode(line, add_special_tokens=False).ids
                f.write(",".join(str(i) for i in ([bos] if bos is not None else []) + ids) + "\n")
        print(f"wrote {a.ids_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
