#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""dump_hf.py against a REAL transformers install (skipped, exit 77, where there is none).

Tiny random models built with from_config -- no download: Llama with llama3 RoPE, Qwen3
(q/k norms before RoPE), Mistral with sliding_window = 8 and no layer_types (prompt longer
than the window). Each is dumped by dump_hf.main(argv, model=..., tokenizer=...) in
float32 on CPU, and checked against the model itself:
  - keys: forward hooks on every layer's k_proj (and k_norm when present) and on the
    model's rotary_emb give the pre-RoPE keys and cos/sin of every forward; the model
    file's own apply_rotary_pos_emb of them must equal the trace's keys, and the queries
    likewise from q_proj / q_norm (bit for bit: same operations on the same CPU tensors);
  - the trace's /rope/inv_freq equals rotary_emb.inv_freq, its rope_attention_scaling
    rotary_emb.attention_scaling; the metadata rebuilds the pre-RoPE keys (1e-5 relative);
  - --pre-rope-keys: /layers/Lxx/keys_pre_rope equals the k_proj/k_norm hooks;
  - layer attributes: scaling = the attention module's scaling, sliding_window and
    cache_sliding_window 8 for Mistral;
  - the greedy tokens equal model.generate(do_sample=False) (eager attention);
  - `fadkv-bench info` reads every trace (FK_BIN or build/fadkv-bench).

usage: test_dump_hf_transformers.py [FADKV_BENCH_EXE]; exit 0 pass, 1 fail, 77 skip.
Written against the documented transformers >= 4.56 API; it has NOT been run here (no
transformers on the machine it was written on).
"""
import json
import os
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import h5py
    import torch
    import transformers
except ImportError as e:
    print("skip: %s (this test needs transformers >= 4.56, torch, numpy, h5py)" % e)
    sys.exit(SKIP)

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# check(), finish(), run_info() and the dump_hf import of the offline suite (which
# installs no stand-in transformers at import time).
import test_python_tools as tp  # noqa: E402
from test_python_tools import check, dump_hf  # noqa: E402

if dump_hf._version_tuple(transformers.__version__) < dump_hf.MIN_TRANSFORMERS:
    print("skip: transformers %s < %d.%d" % ((transformers.__version__,) +
                                             dump_hf.MIN_TRANSFORMERS))
    sys.exit(SKIP)

V5 = dump_hf._version_tuple(transformers.__version__) >= (5, 0)


class Tok:
    """A tokenizer stand-in: one id per byte (mod the vocabulary); no EOS."""
    eos_token_id = None

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, text):
        return {"input_ids": [1] + [b % (self.vocab - 3) + 3 for b in text.encode()]}

    def decode(self, ids, skip_special_tokens=False):
        return "|".join(str(int(i)) for i in ids)


def rope_kw(params):
    if V5:
        return {"rope_parameters": params}
    params = dict(params)
    theta = params.pop("rope_theta")
    return {"rope_theta": theta, "rope_scaling": params if params["rope_type"] != "default"
            else None}


def models():
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=256, eos_token_id=None, bos_token_id=1,
                  pad_token_id=0)
    from transformers import LlamaConfig, MistralConfig, Qwen3Config
    yield "llama3", LlamaConfig(**common, **rope_kw(
        {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})), None
    yield "qwen3", Qwen3Config(**common, **rope_kw({"rope_type": "default",
                                                     "rope_theta": 1e6})), None
    yield "mistral", MistralConfig(sliding_window=8, **common, **rope_kw(
        {"rope_type": "default", "rope_theta": 10000.0})), 8


def hooks(model):
    """Forward hooks recording, per layer, the pre-RoPE q/k ([B, H, t, d]) of every forward
    (q_norm/k_norm output when the attention has them, else q_proj/k_proj reshaped), and
    cos/sin of rotary_emb."""
    rec = {"cos": [], "q": {}, "k": {}}
    hs = []
    rot = model.model.rotary_emb
    hs.append(rot.register_forward_hook(lambda m, i, o: rec["cos"].append(o)))
    for l, layer in enumerate(model.model.layers):
        att = layer.self_attn
        d = att.head_dim
        for kind in ("q", "k"):
            mod = getattr(att, kind + "_norm", None) or getattr(att, kind + "_proj")

            def hook(m, i, o, kind=kind, l=l, d=d):
                x = o.detach()
                x = x.view(x.shape[0], x.shape[1], -1, d).transpose(1, 2)
                rec[kind].setdefault(l, []).append(x)
            hs.append(mod.register_forward_hook(hook))
    return rec, hs


def run_one(tmp, name, cfg, window):
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.to(torch.float32).eval()
    tok = Tok(cfg.vocab_size)
    prompt = "a prompt longer than the sliding window"
    ptxt = os.path.join(tmp, name + ".txt")
    with open(ptxt, "w") as f:
        f.write(prompt + "\n")
    out = os.path.join(tmp, name)
    rec, hs = hooks(model)
    steps = 8
    rc = dump_hf.main(["--model", "random/" + name, "--prompts", ptxt, "--out", out,
                       "--max-new-tokens", str(steps), "--dtype", "float32", "--device", "cpu",
                       "--attn-base", "eager", "--pre-rope-keys"], model=model, tokenizer=tok)
    for h in hs:
        h.remove()
    path = os.path.join(out, "trace-00000.h5")
    check(rc == 0 and os.path.exists(path), "[%s] main(model=...) wrote a trace" % name)
    mod = sys.modules[type(model.model.layers[0].self_attn).__module__]
    ids = tok(prompt)["input_ids"]
    with h5py.File(path, "r") as f:
        a = f.attrs
        T = f["tokens/ids"].shape[0]
        ok_k = ok_q = True
        for l in range(cfg.num_hidden_layers):
            ks, qs = [], []
            for (cos, sin), q, k in zip(rec["cos"], rec["q"][l], rec["k"][l]):
                qe, ke = mod.apply_rotary_pos_emb(q, k, cos, sin)
                ks.append(ke[0])
                qs.append(qe[0])
            ok_k &= np.array_equal(f["layers/L%02d/keys" % l][...], torch.cat(ks, 1).numpy())
            ok_q &= np.array_equal(f["layers/L%02d/queries" % l][...], torch.cat(qs, 1).numpy())
        ok_pre = all(np.array_equal(f["layers/L%02d/keys_pre_rope" % l][...],
                                    torch.cat([x[0] for x in rec["k"][l]], 1).numpy())
                     for l in range(cfg.num_hidden_layers))
        check(ok_pre, "[%s] --pre-rope-keys: keys_pre_rope = the k_proj/k_norm hooks" % name)
        check(ok_k, "[%s] keys = apply_rotary_pos_emb(k_proj/k_norm hooks, rotary_emb) bit for "
              "bit" % name)
        check(ok_q, "[%s] queries = apply_rotary_pos_emb(q_proj/q_norm hooks, rotary_emb)" % name)
        rot = model.model.rotary_emb
        inv = f["rope/inv_freq"][...]
        check(np.array_equal(inv, rot.inv_freq.float().numpy()) and
              float(a["rope_attention_scaling"]) == float(rot.attention_scaling),
              "[%s] /rope/inv_freq and rope_attention_scaling equal rotary_emb's" % name)
        # Rebuild the pre-RoPE keys of layer 0 from the metadata (rotate_half pairs).
        k = torch.from_numpy(f["layers/L00/keys"][...]).double()
        pos = torch.from_numpy(f["tokens/positions"][...]).double()
        ang = pos[:, None] * torch.from_numpy(inv).double()[None, :]
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        hd = k.shape[-1] // 2
        pre = (k * cos - torch.cat([-k[..., hd:], k[..., :hd]], -1) * sin) / \
            float(a["rope_attention_scaling"])
        want = torch.cat([x[0] for x in rec["k"][0]], 1).double()
        err = float((pre - want).abs().max() / want.abs().max())
        check(err < 1e-5, "[%s] metadata rebuilds pre-RoPE keys (%.2g)" % (name, err))
        att = model.model.layers[0].self_attn
        g = f["layers/L00"].attrs
        check(float(g["scaling"]) == float(att.scaling), "[%s] layer scaling %s" %
              (name, g["scaling"]))
        if window:
            check(g["sliding_window"] == str(window) and
                  g.get("cache_sliding_window", str(window)) == str(window) and
                  len(ids) > window, "[%s] sliding_window %s, cache_sliding_window %s, "
                  "prompt %d > window" % (name, g["sliding_window"],
                                          g.get("cache_sliding_window"), len(ids)))
        if name == "llama3":
            check(a.get("rope_type") == "llama3" and a.get("rope_layout") == "half" and
                  json.loads(a["rope_parameters"]).get("factor") == 8.0,
                  "[llama3] rope_type llama3, rope_layout half, rope_parameters")
        gen = [int(x) for x in a["generated_text"].split("|")] if a["generated_text"] else []
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    else:
        model.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    check(gen == ref[0, len(ids):].tolist(), "[%s] greedy tokens = generate(do_sample=False) "
          "(%d tokens, T = %d)" % (name, len(gen), T))
    tp.run_info(path)  # checks that fadkv-bench info reads it (when the binary is known)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg, window in models():
            try:
                run_one(tmp, name, cfg, window)
            except Exception as e:
                import traceback
                traceback.print_exc()
                check(False, "[%s] raised %s: %s" % (name, type(e).__name__, e))
    return tp.finish()


if __name__ == "__main__":
    sys.exit(main())
