#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Tests of the Python tools: the HF dumper's capture path and writer, the Lexico importer.

No transformers and no real model are available offline, so a tiny torch language model
(3 layers, GQA 4 query / 2 KV heads, head_dim 16, RoPE) stands in for one. Its attention
modules call the very function dump_hf.py registers with transformers' AttentionInterface
(dump_hf.make_capture_attention), the way transformers calls it:
fn(module, query [B, H_q, t, d] post-RoPE, key, value, attention_mask, scaling=..., dropout=...).
Its cache mimics transformers >= 4.56 DynamicCache (.layers[i].keys / .values). The decode
loop is dump_hf.decode_and_record, writing through fkv_trace_writer.TraceWriter. Checks:
  - the C reader accepts each file (`fadkv-bench info`, its output parsed);
  - keys, values and queries read back with h5py equal the module's own post-RoPE tensors
    BIT FOR BIT (bfloat16 raw bits, float16, float32), positions/phase/ids/query_token_idx
    exact, attributes as datasets/README.md requires;
  - the greedy tokens equal an independent cache-free decode of the same model (the loop
    feeds the right tokens, and capturing does not change the attention output);
  - seeded top-p sampling is reproducible, top_p -> 0 equals greedy;
  - the writer's float32 -> bf16 rounding equals torch's, and it refuses a prompt_len
    mismatch or a NaN without leaving any file behind;
  - import_lexico_dict.py on random (2L, m, N) tensors (bare fp32, and fp16 inside a dict):
    `fadkv-bench info` accepts the output and its atoms equal the tensor's columns
    (transposed, float32) exactly; malformed inputs fail without an output file.

usage: test_python_tools.py [FADKV_BENCH_EXE]   (or env FK_BIN); exit 0 pass, 1 fail, 77 skip.
"""
import hashlib
import math
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import h5py
    import torch
except ImportError as e:  # pragma: no cover
    print("skip: %s (run with PYENV_VERSION=system python3)" % e)
    sys.exit(SKIP)

sys.dont_write_bytecode = True  # keep __pycache__ out of the source tree
SRC = os.environ.get("FK_SRCDIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = os.path.join(SRC, "datasets")
sys.path.insert(0, DATASETS)
import dump_hf  # noqa: E402
import fkv_trace_writer as fw  # noqa: E402

FAILURES = []


def check(cond, what):
    if cond:
        print("ok   " + what)
    else:
        print("FAIL " + what)
        FAILURES.append(what)
    return cond


def find_bin():
    b = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FK_BIN")
    if b:
        return b
    b = os.path.join(SRC, "build", "fadkv-bench")
    return b if os.path.exists(b) else None


BIN = find_bin()


def run_info(path):
    if BIN is None:
        print("note: no fadkv-bench binary (set FK_BIN); C reader checks skipped")
        return None
    r = subprocess.run([BIN, "info", path], capture_output=True, text=True)
    if not check(r.returncode == 0, "fadkv-bench info accepts %s" % os.path.basename(path)):
        print(r.stdout + r.stderr)
        return None
    return r.stdout


# ---- the tiny model --------------------------------------------------------------------
# Cache layers with the contracts of transformers >= 4.56 (cache_utils.py):
#   DynamicLayer.update appends along tokens and returns ITS OWN storage (self.keys);
#   DynamicSlidingWindowLayer keeps the last sliding_window - 1 tokens, returns the
#     concatenation (kept + new) and counts every token in cumulative_length;
#   StaticLayer preallocates max_cache_len rows, writes the new tokens at
#     cache_kwargs["cache_position"] and returns the WHOLE buffer.
# get_seq_length() is the number of tokens seen (cumulative for sliding layers; rows
# holding a nonzero key for a static layer, as upstream).

class DynamicLayer:
    is_sliding = False

    def __init__(self):
        self.keys = None
        self.values = None

    def update(self, key_states, value_states, cache_kwargs=None):
        if self.keys is None:
            self.keys, self.values = key_states, value_states
        else:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
        return self.keys, self.values

    def get_seq_length(self):
        return 0 if self.keys is None else self.keys.shape[-2]


TinyLayer = DynamicLayer


class DynamicSlidingWindowLayer(DynamicLayer):
    is_sliding = True

    def __init__(self, sliding_window):
        super().__init__()
        self.sliding_window = sliding_window
        self.cumulative_length = 0

    def update(self, key_states, value_states, cache_kwargs=None):
        self.cumulative_length += key_states.shape[-2]
        if self.keys is None:
            full_k, full_v = key_states, value_states
        else:
            full_k = torch.cat([self.keys, key_states], dim=-2)
            full_v = torch.cat([self.values, value_states], dim=-2)
        self.keys = full_k[:, :, -self.sliding_window + 1:, :]
        self.values = full_v[:, :, -self.sliding_window + 1:, :]
        return full_k, full_v

    def get_seq_length(self):
        return self.cumulative_length


class StaticLayer(DynamicLayer):
    def __init__(self, max_cache_len):
        super().__init__()
        self.max_cache_len = max_cache_len

    def update(self, key_states, value_states, cache_kwargs=None):
        if self.keys is None:
            B, H, _, d = key_states.shape
            self.keys = torch.zeros(B, H, self.max_cache_len, d, dtype=key_states.dtype)
            self.values = torch.zeros(B, H, self.max_cache_len, d, dtype=value_states.dtype)
        pos = cache_kwargs["cache_position"]
        self.keys.index_copy_(2, pos, key_states)
        self.values.index_copy_(2, pos, value_states)
        return self.keys, self.values

    def get_seq_length(self):
        return 0 if self.keys is None else int(self.keys[0, 0].any(dim=-1).sum())


class LossyLayer(DynamicLayer):
    """A cache that stores (and hands attention) an fp16-rounded copy of fp32 keys, as a
    quantised cache would: what attention sees is not what the model computed."""

    def update(self, key_states, value_states, cache_kwargs=None):
        return DynamicLayer.update(self, key_states.half().float(), value_states,
                                   cache_kwargs)


class TinyCache:
    """Mimics transformers' Cache: .layers, update(k, v, layer_idx, cache_kwargs)."""

    def __init__(self, n_layers, layer=DynamicLayer):
        self.layers = [layer() for _ in range(n_layers)]

    def update(self, k, v, layer_idx, cache_kwargs=None):
        return self.layers[layer_idx].update(k, v, cache_kwargs)

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].get_seq_length()

    def seq_length(self):
        return self.get_seq_length(0)


class TinyRotary(torch.nn.Module):
    """A rotary embedding as in transformers (LlamaRotaryEmbedding): inv_freq buffer
    [d/2] (float32), attention_scaling multiplying cos and sin, rope_type. kind "default",
    "llama3" (HF's _compute_llama3_parameters) or "yarn" (frequencies blended between
    inv_freq and inv_freq / factor by a linear ramp, attention_factor 0.1 ln(factor) + 1, as
    _compute_yarn_parameters with its defaults)."""

    def __init__(self, d, theta, kind="default", p=None):
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        scale = 1.0
        if kind == "llama3":
            L0, f, lo, hi = (p["original_max_position_embeddings"], p["factor"],
                             p["low_freq_factor"], p["high_freq_factor"])
            wl = 2 * math.pi / inv
            sm = (L0 / wl - lo) / (hi - lo)
            mid = (1 - sm) * inv / f + sm * inv
            inv = torch.where(wl > L0 / lo, inv / f, torch.where(wl < L0 / hi, inv, mid))
        elif kind == "yarn":
            f = p["factor"]
            ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float64) - 1) / (d // 2 - 3),
                               0, 1)
            inv = inv / f * ramp + inv * (1 - ramp)
            scale = 0.1 * math.log(f) + 1.0
        self.rope_type = kind
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        self.attention_scaling = scale


def rope(x, pos, theta, inv=None, scale=1.0):
    """HF-style rotary embedding (rotate_half) of x [B, H, t, d] at positions pos [t]: with
    the frequencies `inv` (default theta^(-2i/d)) and cos, sin multiplied by `scale`."""
    d = x.shape[-1]
    if inv is None:
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv.to(torch.float64)[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = (emb.cos() * scale).float(), (emb.sin() * scale).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


EAGER_CALLS = [0]


def eager_gqa_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                        softcap=None, **kwargs):
    """Reference attention with the transformers signature; keys/values before repeat_kv.
    softcap as eager_attention_forward of Gemma 2 (tanh capping of the scores); sdpa (the
    same function registered as "sdpa") ignores it, as upstream does."""
    g = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(g, dim=1)
    v = value.float().repeat_interleave(g, dim=1)
    s = query.float() @ k.transpose(-1, -2) * scaling
    if softcap is not None and kwargs.get("_eager"):
        s = torch.tanh(s / softcap) * softcap
    if attention_mask is not None:
        s = s + attention_mask
    p = torch.softmax(s, dim=-1)
    return (p @ v).transpose(1, 2).contiguous(), p


def eager_attention_forward(module, query, key, value, attention_mask, scaling, **kwargs):
    """The model file's own eager attention (dump_hf resolves "eager" to this function of
    the attention module's Python module, as transformers keeps eager out of the
    interface)."""
    EAGER_CALLS[0] += 1
    return eager_gqa_attention(module, query, key, value, attention_mask, scaling,
                               _eager=True, **kwargs)


def causal_mask(t, past):
    """Mask function registered with the stand-in mask interface (only its presence
    matters: TinyAttention builds the mask for the keys the cache returns)."""
    if t == 1:
        return None
    return torch.full((t, past + t), float("-inf")).triu(past + 1)[None, None]


def kv_mask(pos, kv_len, window):
    """Additive mask [1, 1, t, kv_len] for queries at positions pos over the kv_len keys a
    cache returned: rows are positions end - kv_len .. end - 1 (dynamic, sliding) or 0 ..
    kv_len - 1 (a static buffer longer than the sequence; rows >= end masked). Causal, and
    with a window W: key position > query position - W (transformers' sliding_window)."""
    end = int(pos[-1]) + 1
    kv_pos = torch.arange(kv_len) + (end - kv_len if kv_len <= end else 0)
    ok = (kv_pos[None, :] <= pos[:, None]) & (kv_pos[None, :] < end)
    if window:
        ok &= kv_pos[None, :] > pos[:, None] - window
    return torch.where(ok, 0.0, float("-inf"))[None, None]


class TinyRMSNorm(torch.nn.Module):
    """Qwen3RMSNorm-like module (weight near 1), applied to [B, t, H, d]."""

    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.3 * torch.randn(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class TinyAttention(torch.nn.Module):
    def __init__(self, layer_idx, hidden, hq, hkv, d, kv_dtype, theta, truth, rotary=None,
                 qk_norm=False, softcap=None, sliding_window=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.hq, self.hkv, self.d, self.theta = hq, hkv, d, theta
        self.kv_dtype = kv_dtype
        self.q_proj = torch.nn.Linear(hidden, hq * d, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hkv * d, bias=False)
        self.v_proj = torch.nn.Linear(hidden, hkv * d, bias=False)
        self.o_proj = torch.nn.Linear(hq * d, hidden, bias=False)
        self.rotary = rotary
        self.softcap, self.sliding_window = softcap, sliding_window
        self.head_dim = d
        if qk_norm:  # Qwen3: RMSNorm modules over each head's d channels, before RoPE
            self.q_norm, self.k_norm = TinyRMSNorm(d), TinyRMSNorm(d)
        else:
            self.q_norm = self.k_norm = None
        self.attn_fn = eager_gqa_attention
        self.truth = truth  # list of (layer, q, k, v, k_pre) of every forward, for the test

    def forward(self, h, pos, cache, use_mask=True):
        B, t, _ = h.shape
        q = self.q_proj(h).view(B, t, self.hq, self.d)
        k = self.k_proj(h).view(B, t, self.hkv, self.d)
        if self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(h).view(B, t, self.hkv, self.d).transpose(1, 2)
        inv, sc = (None, 1.0) if self.rotary is None else (self.rotary.inv_freq,
                                                            self.rotary.attention_scaling)
        k_pre = k
        q = rope(q, pos, self.theta, inv, sc).to(self.kv_dtype)
        k = rope(k, pos, self.theta, inv, sc).to(self.kv_dtype)
        v = v.to(self.kv_dtype)
        if self.truth is not None:
            self.truth.append((self.layer_idx, q[0].clone(), k[0].clone(), v[0].clone(),
                               k_pre[0].detach().clone()))
        kf, vf = cache.update(k, v, self.layer_idx, {"cache_position": pos})
        mask = kv_mask(pos, kf.shape[-2], self.sliding_window) if use_mask else None
        kw = {}
        if self.softcap is not None:
            kw["softcap"] = self.softcap
        if self.sliding_window is not None:
            kw["sliding_window"] = self.sliding_window
        out, _ = self.attn_fn(self, q, kf, vf, mask, scaling=self.d ** -0.5, dropout=0.0, **kw)
        return self.o_proj(out.reshape(B, t, self.hq * self.d).float())


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=61, hidden=32, L=3, hq=4, hkv=2, d=16, kv_dtype=torch.float32,
                 theta=10000.0, truth=None, rope_kind=None, rope_params=None, qk_norm=False,
                 softcap=None, sliding_window=None):
        super().__init__()
        self.L, self.hq, self.hkv, self.d, self.theta = L, hq, hkv, d, theta
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.rotary_emb = None if rope_kind is None else TinyRotary(d, theta, rope_kind,
                                                                    rope_params)
        self.attn = torch.nn.ModuleList(
            [TinyAttention(i, hidden, hq, hkv, d, kv_dtype, theta, truth, self.rotary_emb,
                           qk_norm, softcap, sliding_window) for i in range(L)])
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def set_attention(self, fn):
        for a in self.attn:
            a.attn_fn = fn

    def forward(self, ids, cache, use_mask=True):
        t = ids.shape[1]
        past = cache.seq_length()
        pos = torch.arange(past, past + t)
        h = self.emb(ids)
        for a in self.attn:
            h = h + a(torch.nn.functional.layer_norm(h, h.shape[-1:]), pos, cache, use_mask)
        return self.head(torch.nn.functional.layer_norm(h, h.shape[-1:]))[0, -1]


def cache_free_greedy(model, prompt, steps, attn=eager_gqa_attention):
    """Independent greedy decode: recompute the whole sequence at every step, no capture."""
    model.set_attention(attn)
    saved = [a.truth for a in model.attn]
    for a in model.attn:
        a.truth = None
    seq = list(prompt)
    out = []
    for _ in range(steps):
        logits = TinyLM.forward(model, torch.tensor([seq]), TinyCache(model.L))
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        seq.append(nxt)
    for a, t in zip(model.attn, saved):
        a.truth = t
    return out


def bits(x):
    """Raw bit patterns of a tensor or array, for exact comparisons."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np.uint16)
        x = x.contiguous().numpy()
    x = np.ascontiguousarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def trace_attrs(model, prompt_len, enc):
    return {"model_id": "tiny-gqa-test", "num_layers": model.L, "num_q_heads": model.hq,
            "num_kv_heads": model.hkv, "head_dim": model.d, "keys_post_rope": 1,
            "rope_theta": model.theta, "source": "hf", "prompt_len": prompt_len,
            "dumper_version": dump_hf.DUMPER_VERSION, "prompt": "tiny prompt",
            "sampling": '{"mode": "greedy"}', "dtype": enc, "generator": "test_python_tools"}


# ---- tests ---------------------------------------------------------------------------------

def test_dump(tmp, enc, queries=True):
    torch.manual_seed(1234)
    truth = []
    model = TinyLM(kv_dtype=getattr(torch, enc), truth=truth)
    prompt = [3, 17, 42, 5, 8, 13, 21]
    steps = 9
    capture = dump_hf.Capture(want_queries=queries)
    model.set_attention(dump_hf.make_capture_attention(capture, eager_gqa_attention))
    cache = TinyCache(model.L)
    path = os.path.join(tmp, "tiny-%s%s.h5" % (enc, "" if queries else "-noq"))
    P = len(prompt)
    with torch.no_grad():
        # chunk_tokens=4 makes the 16-token trace span several chunks and partial appends
        # flush_tokens=3 for bf16: prefill in one write, then flushes every 3 tokens
        with fw.TraceWriter(path, trace_attrs(model, P, enc), enc, queries=queries,
                            chunk_tokens=4, flush_tokens=3 if enc == "bfloat16" else 64) as w:
            gen, reason = dump_hf.decode_and_record(lambda ids: model(ids, cache), cache,
                                                    capture, w, prompt, steps,
                                                    dump_hf.Sampler(greedy=True))
            w.set_attr("generated_text", " ".join(map(str, gen)))
    tag = "[%s%s]" % (enc, "" if queries else ", no queries")
    T = P + steps
    check(reason == "max_new_tokens" and len(gen) == steps, "%s decode ran %d steps" % (tag, steps))
    check(os.path.exists(path) and not [f for f in os.listdir(tmp) if ".tmp" in f],
          "%s file renamed into place, no temporary left" % tag)
    check(capture.calls == model.L * (1 + steps),
          "%s capture saw %d attention calls (L x forwards)" % (tag, capture.calls))
    with torch.no_grad():
        ref = cache_free_greedy(model, prompt, steps)
    check(ref == gen, "%s greedy tokens equal a cache-free recompute: %s" % (tag, gen))

    out = run_info(path)
    if out is not None:
        want = [
            "trace v1, model 'tiny-gqa-test', source hf",
            "layers 3, query heads 4, KV heads 2 (GQA group 2), head_dim 16",
            "tokens %d (prefill %d, decode %d), keys_post_rope 1, rope_theta 10000" % (T, P, steps),
            "queries: yes (%d rows per head)" % T if queries else "queries: no",
            "generator: test_python_tools",
        ]
        for s in want:
            check(s in out, "%s info prints %r" % (tag, s))

    # Module truth per layer, concatenated along tokens in forward order.
    per = {l: ([], [], []) for l in range(model.L)}
    for l, q, k, v, _ in truth[: model.L * (1 + steps)]:
        per[l][0].append(q)
        per[l][1].append(k)
        per[l][2].append(v)
    with h5py.File(path, "r") as f:
        a = f.attrs
        check(a["schema"] == "fadkv-trace" and int(a["schema_version"]) == 1 and
              int(a["num_layers"]) == 3 and int(a["num_q_heads"]) == 4 and
              int(a["num_kv_heads"]) == 2 and int(a["head_dim"]) == 16 and
              int(a["keys_post_rope"]) == 1 and int(a["prompt_len"]) == P and
              a["source"] == "hf" and float(a["rope_theta"]) == 10000.0,
              "%s root attributes" % tag)
        check(np.array_equal(f["tokens/positions"][:], np.arange(T)) and
              f["tokens/positions"].dtype == np.int32, "%s positions 0..T-1 (int32)" % tag)
        check(np.array_equal(f["tokens/phase"][:], [0] * P + [1] * steps) and
              f["tokens/phase"].dtype == np.uint8, "%s phase = P zeros then ones" % tag)
        check(np.array_equal(f["tokens/ids"][:], prompt + gen), "%s token ids" % tag)
        ok_kv = ok_q = ok_enc = ok_idx = True
        for l in range(model.L):
            g = f["layers/L%02d" % l]
            names = [("keys", 1), ("values", 2)] + ([("queries", 0)] if queries else [])
            for name, i in names:
                ds = g[name]
                want = torch.cat(per[l][i], dim=1)   # [H, T, d]
                ok_enc &= ds.attrs["encoding"] == enc and ds.chunks == (1, 4, 16)
                same = ds.shape == tuple(want.shape) and np.array_equal(bits(ds[...]), bits(want))
                if name == "queries":
                    ok_q &= same
                else:
                    ok_kv &= same
            if queries:
                ok_idx &= np.array_equal(g["query_token_idx"][:], np.arange(T))
            else:
                ok_idx &= "queries" not in g and "query_token_idx" not in g
        check(ok_enc, "%s every dataset has encoding %r and [1, 4, d] chunks" % (tag, enc))
        check(ok_kv, "%s keys and values equal the module's post-RoPE tensors bit for bit" % tag)
        if queries:
            check(ok_q, "%s queries equal the module's post-RoPE queries bit for bit" % tag)
        check(ok_idx, "%s query_token_idx" % tag)
        if enc == "bfloat16":
            # The decoded values equal the float32 widening of the bf16 tensors.
            k0 = fw.bf16_bits_to_f32(f["layers/L00/keys"][...])
            check(np.array_equal(k0, torch.cat(per[0][1], 1).float().numpy()),
                  "%s bf16 bits widen to the module's values" % tag)
    return path


def test_sampling():
    torch.manual_seed(7)
    model = TinyLM()
    prompt = [1, 2, 3, 4]

    def run(sampler, steps=12):
        cache = TinyCache(model.L)
        capture = dump_hf.Capture(want_queries=False)
        model.set_attention(dump_hf.make_capture_attention(capture, eager_gqa_attention))
        sampler.reset()
        with tempfile.TemporaryDirectory() as t, torch.no_grad():
            with fw.TraceWriter(os.path.join(t, "s.h5"), trace_attrs(model, 4, "float32"),
                                "float32", queries=False) as w:
                gen, _ = dump_hf.decode_and_record(lambda ids: model(ids, cache), cache,
                                                   capture, w, prompt, steps, sampler)
        return gen

    s = dump_hf.Sampler(greedy=False, temperature=1.5, top_p=0.95, seed=11)
    a, b = run(s), run(s)
    check(a == b, "seeded top-p sampling is reproducible: %s" % a)
    g = run(dump_hf.Sampler(greedy=True))
    c = run(dump_hf.Sampler(greedy=False, temperature=1.0, top_p=1e-9, seed=5))
    check(c == g, "top_p -> 0 equals greedy")
    check(a != g, "sampling at temperature 1.5 departs from greedy")
    gen_eos = None
    cache = TinyCache(model.L)
    capture = dump_hf.Capture(want_queries=False)
    model.set_attention(dump_hf.make_capture_attention(capture, eager_gqa_attention))
    with tempfile.TemporaryDirectory() as t, torch.no_grad():
        p = os.path.join(t, "eos.h5")
        with fw.TraceWriter(p, trace_attrs(model, 4, "float32"), "float32",
                            queries=False) as w:
            gen_eos, reason = dump_hf.decode_and_record(lambda ids: model(ids, cache), cache,
                                                        capture, w, prompt, 12,
                                                        dump_hf.Sampler(), eos_ids=[g[3]])
            T = w.T
    k = g.index(g[3])
    check(reason == "eos" and gen_eos == g[:k + 1] and T == 4 + k,
          "an end-of-sequence token stops decoding and is not fed (T = %d)" % T)


def test_writer_guards(tmp):
    x = np.concatenate([np.random.default_rng(3).standard_normal(20000).astype(np.float32) *
                        np.float32(1e3),
                        np.array([0.0, -0.0, 1.0, 65504.0, 3.4e38, 1e-40, -1e-45,
                                  1.00390625, 1.01171875], dtype=np.float32)])
    mine = fw.f32_to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    check(np.array_equal(mine, theirs), "float32 -> bf16 rounding equals torch's (ties even)")

    torch.manual_seed(0)
    m = TinyLM()
    k = [torch.zeros(2, 1, 16)] * 3
    path = os.path.join(tmp, "guard.h5")
    try:
        with fw.TraceWriter(path, trace_attrs(m, 2, "float32"), "float32", queries=False) as w:
            w.append([0], 0, k, k, ids=[1])
        ok = False
    except ValueError as e:
        ok = "prompt_len" in str(e)
    check(ok and not os.listdir(tmp), "prompt_len mismatch refused, nothing left on disk")
    bad = [torch.zeros(2, 1, 16)] * 3
    bad[1] = bad[1].clone()
    bad[1][1, 0, 5] = float("nan")
    try:
        with fw.TraceWriter(path, trace_attrs(m, 1, "bfloat16"), "bfloat16",
                            queries=False) as w:
            w.append([0], 0, k, bad, ids=[1])
        ok = False
    except ValueError as e:
        ok = "layer 1 values" in str(e)
    check(ok and not os.listdir(tmp), "a NaN is refused with its layer, nothing left on disk")
    try:
        with fw.TraceWriter(path, trace_attrs(m, 1, "float32"), "float32",
                            queries=False) as w:
            w.append([0], 1, k, k, ids=[1])
            w.append([1], 0, k, k, ids=[1])
        ok = False
    except ValueError as e:
        ok = "prefill" in str(e)
    check(ok and not os.listdir(tmp), "a prefill token after a decode token is refused")


def test_import(tmp):
    script = os.path.join(DATASETS, "import_lexico_dict.py")
    L, m, N = 3, 16, 40
    g = torch.Generator().manual_seed(99)
    D = torch.randn(2 * L, m, N, generator=g)
    D = D / D.norm(dim=1, keepdim=True) * (1 + 1e-3 * torch.randn(1, 1, N, generator=g))
    cases = [("bare fp32 tensor", D, None, ""),
             ("fp16 tensor in a state_dict", {"D": D.half(), "step": torch.tensor(3)}, None, "D"),
             ("nested dict with --tensor-key", {"m": {"dict": D}, "x": D[:2]}, "m/dict",
              "m/dict")]
    for i, (what, obj, key, want_key) in enumerate(cases):
        src = os.path.join(tmp, "lexico-%d.pt" % i)
        out = os.path.join(tmp, "lexico-%d.h5" % i)
        torch.save(obj, src)
        cmd = [sys.executable, script, src, out] + (["--tensor-key", key] if key else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if not check(r.returncode == 0, "import %s: exit 0" % what):
            print(r.stdout + r.stderr)
            continue
        info = run_info(out)
        if info is not None:
            check(re.search(r"dictionary v1, 3 layers x \{K, V\}, N = 40 atoms, head_dim 16, "
                            r"0 dead atoms", info) is not None,
                  "import %s: info reads 3 layers, 40 atoms, head_dim 16" % what)
        ref = D.half().float() if "fp16" in what else D
        with h5py.File(out, "r") as f:
            ok = True
            for l in range(L):
                for kind, s in (("keys", 2 * l), ("values", 2 * l + 1)):
                    ds = f["layers/L%02d/%s" % (l, kind)]
                    want = ref[s].t().contiguous().numpy()
                    ok &= ds.dtype == np.float32 and ds.shape == (N, m)
                    ok &= np.array_equal(bits(ds[...]), bits(want))
            check(ok, "import %s: atom j of slice 2l/2l+1 = column j, float32, exact" % what)
            a = f.attrs
            sha = hashlib.sha256(open(src, "rb").read()).hexdigest()
            check(a["schema"] == "fadkv-dict" and int(a["schema_version"]) == 1 and
                  int(a["num_layers"]) == L and int(a["head_dim"]) == m and
                  int(a["atoms"]) == N and a["method"] == "lexico-import" and
                  a["source_file"] == os.path.basename(src) and a["source_sha256"] == sha and
                  a["tensor_key"] == want_key,
                  "import %s: attributes and provenance (sha256 of the source)" % what)
    bad_cases = [("odd slice count", torch.randn(5, m, N), []),
                 ("two 3-D tensors, no key", {"a": D, "b": D}, []),
                 ("non-finite atom", D.clone().index_put_((torch.tensor([3]), torch.tensor([2]),
                                                          torch.tensor([7])),
                                                         torch.tensor(float("inf"))), [])]
    for what, obj, extra in bad_cases:
        src = os.path.join(tmp, "bad.pt")
        out = os.path.join(tmp, "bad.h5")
        torch.save(obj, src)
        r = subprocess.run([sys.executable, script, src, out] + extra, capture_output=True,
                           text=True)
        check(r.returncode != 0 and not os.path.exists(out) and
              not [f for f in os.listdir(tmp) if ".tmp" in f],
              "import refuses %s (%s)" % (what, r.stderr.strip().splitlines()[-1]
                                          if r.stderr.strip() else "no message"))


# ---- dump_hf.main() against a stand-in transformers ----------------------------------------

def make_interface(defaults):
    """A registry class as transformers' GeneralInterface (AttentionInterface,
    AttentionMaskInterface): register() is a classmethod writing the class-wide
    _global_mapping, which models read; item assignment writes the instance's
    _local_mapping only, which the models (reading the global mapping through their own
    lookup) ignore -- a dumper that assigned an item would get no capture."""
    class Interface:
        _global_mapping = dict(defaults)

        def __init__(self):
            self._local_mapping = {}

        def __getitem__(self, key):
            if key in self._local_mapping:
                return self._local_mapping[key]
            return self._global_mapping[key]

        def __setitem__(self, key, fn):
            self._local_mapping[key] = fn

        def __contains__(self, key):
            return key in self._local_mapping or key in self._global_mapping

        @classmethod
        def register(cls, key, fn):
            cls._global_mapping[key] = fn
    return Interface


# Stand-in checkpoints: from_pretrained(name) builds a TinyLM with this config.
FAKE_MODELS = {
    "fake/tiny": dict(rope_theta=10000.0),
    "fake/llama3": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "fake/yarn": dict(rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    "fake/qwen3": dict(rope_theta=1e6, qk_norm=True),
    "fake/mistral": dict(rope_theta=10000.0, sliding_window=8, seed=1240),
    "fake/softcap": dict(rope_theta=10000.0, attn_logit_softcapping=30.0),
    "fake/dynamic": dict(rope_theta=10000.0, rope_scaling={"rope_type": "dynamic",
                                                           "factor": 2.0}),
}


def install_fake_transformers(version="4.56.0", attention_interface=True):
    """A minimal module named `transformers` exposing what dump_hf.main() uses, with the
    >= 4.56 contracts: AttentionInterface / masking_utils.ALL_MASK_ATTENTION_FUNCTIONS as
    registries (make_interface: register is global, item assignment local and ignored; a
    model whose attention implementation has no registered mask function gets NO causal
    mask; from_pretrained refuses an implementation name not registered); DynamicCache
    (config=) building DynamicLayer's, or DynamicSlidingWindowLayer's for the layer_types
    marked sliding, or for every layer when the config has sliding_window and no
    layer_types (Mistral v0.1); the attention calls with scaling, sliding_window and softcap
    (Gemma 2's attn_logit_softcapping) as keyword arguments; the rotary embedding module
    with inv_freq and attention_scaling; from_pretrained(attn_implementation=, dtype=) and
    logits_to_keep. With attention_interface=False it is a release before 4.48 (no
    AttentionInterface). It mirrors the API as documented; it is not transformers."""
    import types
    tf = types.ModuleType("transformers")
    tf.__version__ = version
    mu = types.ModuleType("transformers.modeling_utils")
    ms = types.ModuleType("transformers.masking_utils")
    AttentionInterface = make_interface({"sdpa": eager_gqa_attention})
    MaskInterface = make_interface({"sdpa": causal_mask, "eager": causal_mask})
    mu.ALL_ATTENTION_FUNCTIONS = AttentionInterface()
    ms.ALL_MASK_ATTENTION_FUNCTIONS = MaskInterface()
    if attention_interface:
        tf.AttentionInterface = AttentionInterface
    loaded = []

    def make_config(name):
        spec = dict(FAKE_MODELS[name])
        cfg = types.SimpleNamespace(num_hidden_layers=3, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, hidden_size=32,
                                    _commit_hash="0123abcd")
        for k, v in spec.items():
            if k not in ("qk_norm", "seed"):
                setattr(cfg, k, v)
        return cfg, spec

    class DynamicCache(TinyCache):
        def __init__(self, config=None):
            n = config.num_hidden_layers
            types_ = getattr(config, "layer_types", None)
            W = getattr(config, "sliding_window", None)
            if types_ is None:
                types_ = ["sliding_attention" if W else "full_attention"] * n
            self.layers = [DynamicSlidingWindowLayer(W) if t == "sliding_attention"
                           else DynamicLayer() for t in types_]

    class Model(TinyLM):
        def forward(self, input_ids=None, past_key_values=None, use_cache=True,
                    logits_to_keep=0):
            impl = self.config._attn_implementation
            fn = eager_attention_forward if impl == "eager" else AttentionInterface()[impl]
            self.set_attention(fn)
            logits = TinyLM.forward(self, input_ids, past_key_values,
                                    use_mask=impl in MaskInterface._global_mapping)
            return types.SimpleNamespace(logits=logits[None, None, :])

    class AutoModelForCausalLM:
        @staticmethod
        def from_pretrained(name, attn_implementation="sdpa", dtype=torch.float32, **kw):
            if attn_implementation != "eager" and \
                    attn_implementation not in AttentionInterface._global_mapping:
                raise ValueError("Specified `attn_implementation=%r` is not supported"
                                 % attn_implementation)
            cfg, spec = make_config(name)
            torch.manual_seed(spec.get("seed", 1234))
            rs = getattr(cfg, "rope_scaling", None) or {}
            m = Model(kv_dtype=dtype, truth=[], theta=cfg.rope_theta,
                      rope_kind=rs.get("rope_type", "default"), rope_params=rs,
                      qk_norm=spec.get("qk_norm", False),
                      softcap=getattr(cfg, "attn_logit_softcapping", None),
                      sliding_window=getattr(cfg, "sliding_window", None))
            m.config = cfg
            m.config._attn_implementation = attn_implementation
            m.generation_config = types.SimpleNamespace(eos_token_id=[60])
            loaded.append((name, attn_implementation, dtype, sorted(kw), m))
            return m

    class Tokenizer:
        eos_token_id = 60

        def __call__(self, text):
            return {"input_ids": [1] + [ord(c) % 50 + 2 for c in text]}

        def apply_chat_template(self, messages, add_generation_prompt, tokenize):
            return {"input_ids": [[1, 52, 53] + self(messages[0]["content"])["input_ids"][1:]
                                  + [54]]}

        def decode(self, ids, skip_special_tokens=False):
            return "|".join(map(str, ids))

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(name, revision=None):
            return Tokenizer()

    tf.AutoModelForCausalLM = AutoModelForCausalLM
    tf.AutoTokenizer = AutoTokenizer
    tf.DynamicCache = DynamicCache
    tf.modeling_utils = mu
    tf.masking_utils = ms
    sys.modules.update({"transformers": tf, "transformers.modeling_utils": mu,
                        "transformers.masking_utils": ms})
    return loaded, Tokenizer()


FAKE_MODULES = ("transformers", "transformers.modeling_utils", "transformers.masking_utils")


def test_main(tmp):
    loaded, tok = install_fake_transformers()
    try:
        prompts = ["Once upon a time", "The KV cache"]
        ptxt = os.path.join(tmp, "prompts.txt")
        with open(ptxt, "w") as f:
            f.write("\n".join([prompts[0], "", prompts[1]]) + "\n")
        out = os.path.join(tmp, "out")
        rc = dump_hf.main(["--model", "fake/tiny", "--prompts", ptxt, "--out", out,
                           "--max-new-tokens", "6", "--dtype", "bfloat16", "--device", "cpu",
                           "--chunk-tokens", "8"])
        check(rc == 0 and len(loaded) == 1, "main(): exit 0, model loaded once")
        name, impl, dtype, kw, model = loaded[0]
        check(impl == dump_hf.CAPTURE_NAME and dtype == torch.bfloat16 and kw == [],
              "main(): model loaded with attn_implementation=%r, dtype=bfloat16" % impl)
        lines = open(os.path.join(out, "manifest.jsonl")).read().splitlines()
        check(len(lines) == 2 and '"file": "trace-00001.h5"' in lines[1],
              "main(): two traces (blank line skipped) listed in manifest.jsonl")
        # The model's own record of what it computed, split per prompt (3 layers x 7 forwards).
        per_prompt = len(model.attn[0].truth) // 2
        for i, p in enumerate(prompts):
            path = os.path.join(out, "trace-%05d.h5" % i)
            info = run_info(path)
            ids = tok(p)["input_ids"]
            if info is not None:
                check("tokens %d (prefill %d, decode 6)" % (len(ids) + 6, len(ids)) in info and
                      "generator: dump_hf.py " + dump_hf.DUMPER_VERSION in info,
                      "main(): info reads trace %d (prefill %d, decode 6)" % (i, len(ids)))
            with h5py.File(path, "r") as f:
                gen = [int(x) for x in f["tokens/ids"][len(ids):]]
                with torch.no_grad():
                    ref = cache_free_greedy(model, ids, 6)
                check(gen == ref[:6], "main(): prompt %d greedy tokens equal a cache-free "
                      "recompute (so the causal mask reached the capture path)" % i)
                a = f.attrs
                check(a["transformers_version"] == "4.56.0" and a["source"] == "hf" and
                      a["model_revision"] == "0123abcd" and a["prompt"] == p and
                      a["sampling"] == '{"mode": "greedy"}' and
                      a["generated_text"] == "|".join(map(str, ref[:6])) and
                      a["stop_reason"] == "max_new_tokens" and int(a["prompt_len"]) == len(ids)
                      and a["attn_implementation"] == "fadkv_capture(sdpa)",
                      "main(): provenance attributes of trace %d" % i)
                check(a["rope_layout"] == "half" and a["rope_type"] == "default" and
                      "rope_factor" not in a and "rope_unsupported" not in a,
                      "main(): trace %d says rope_layout half (rotate_half), type default" % i)
                truth = model.attn[0].truth[i * per_prompt:(i + 1) * per_prompt]
                k = torch.cat([x[2] for x in truth if x[0] == 1], dim=1)
                q = torch.cat([x[1] for x in truth if x[0] == 1], dim=1)
                check(np.array_equal(bits(f["layers/L01/keys"][...]), bits(k)) and
                      np.array_equal(bits(f["layers/L01/queries"][...]), bits(q)),
                      "main(): trace %d layer 1 keys/queries equal the model's bf16 bits" % i)
        test_pca_pre_rope(os.path.join(out, "trace-00000.h5"),
                          os.path.join(out, "trace-00001.h5"), tmp)
        before = os.stat(os.path.join(out, "trace-00000.h5")).st_mtime_ns
        rc = dump_hf.main(["--model", "fake/tiny", "--prompts", ptxt, "--out", out,
                           "--device", "cpu", "--resume"])
        check(rc == 0 and len(loaded) == 2 and
              os.stat(os.path.join(out, "trace-00000.h5")).st_mtime_ns == before,
              "main(): --resume skips traces already dumped")
        pj = os.path.join(tmp, "prompts.jsonl")
        with open(pj, "w") as f:
            f.write('{"prompt": "Hello there", "id": 3}\n')
        out2 = os.path.join(tmp, "out2")
        rc = dump_hf.main(["--model", "fake/tiny", "--prompts", pj, "--out", out2,
                           "--max-new-tokens", "5", "--dtype", "float16", "--device", "cpu",
                           "--temperature", "1.3", "--top-p", "0.9", "--seed", "5",
                           "--chat-template", "--no-queries"])
        path = os.path.join(out2, "trace-00000.h5")
        ok = rc == 0 and run_info(path) is not None
        with h5py.File(path, "r") as f:
            ids = [int(x) for x in f["tokens/ids"][:]]
            ok &= ids[:3] == [1, 52, 53] and "queries" not in f["layers/L00"]
            ok &= f["layers/L00/keys"].dtype == np.float16 and f.attrs["seed"] == "5"
            ok &= '"top_p": 0.9' in f.attrs["sampling"] and f.attrs["chat_template"] == "yes"
        check(ok, "main(): .jsonl prompts, chat template, top-p sampling, float16, no queries")
    finally:
        for k in FAKE_MODULES:
            sys.modules.pop(k, None)


def _decode(tmp, model, cache, name, steps=6, prompt=(3, 17, 42, 5, 8, 13, 21, 9, 30, 2, 11)):
    """decode_and_record `model` with `cache` into tmp/name.h5 (bf16 models store bf16)."""
    enc = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[model.attn[0].kv_dtype]
    capture = dump_hf.Capture(want_queries=True)
    model.set_attention(dump_hf.make_capture_attention(capture, eager_gqa_attention))
    path = os.path.join(tmp, name + ".h5")
    with torch.no_grad(), fw.TraceWriter(path, trace_attrs(model, len(prompt), enc), enc,
                                         chunk_tokens=4) as w:
        gen, _ = dump_hf.decode_and_record(lambda ids: model(ids, cache), cache, capture, w,
                                           list(prompt), steps, dump_hf.Sampler())
    return path, gen


def _truth_kv(model, n_forwards):
    per = {l: ([], []) for l in range(model.L)}
    for l, q, k, v, _ in model.attn[0].truth[: model.L * n_forwards]:
        per[l][0].append(k)
        per[l][1].append(v)
    return {l: (torch.cat(per[l][0], 1), torch.cat(per[l][1], 1)) for l in per}


def _same_kv(path, model, n_forwards):
    want = _truth_kv(model, n_forwards)
    with h5py.File(path, "r") as f:
        return all(np.array_equal(bits(f["layers/L%02d/keys" % l][...]), bits(want[l][0])) and
                   np.array_equal(bits(f["layers/L%02d/values" % l][...]), bits(want[l][1]))
                   for l in range(model.L))


def test_cache_contracts(tmp):
    """Defect 1: keys/values come from Cache.update's key_states/value_states, not from the
    end of layers[i].keys. The old dumper took layers[i].keys[-t:] and compared it with the
    tensor attention received -- the same storage for a DynamicLayer, so the check could
    not fail -- and stored zeros for a StaticLayer (the end of its max_cache_len buffer)."""
    steps = 6
    prompt = [3, 17, 42, 5, 8, 13, 21, 9, 30, 2, 11]

    def faithful(seed, layer, name, window=None, attrs=None):
        """Decode through caches of `layer`; keys/values bit for bit, greedy tokens equal a
        recompute, and layer 1's attributes as `attrs`. Returns (ok, message)."""
        torch.manual_seed(seed)
        model = TinyLM(truth=[], sliding_window=window)
        try:
            path, gen = _decode(tmp, model, TinyCache(model.L, layer=layer), name, steps)
            ok = _same_kv(path, model, 1 + steps)
            with h5py.File(path, "r") as f:
                g = f["layers/L01"].attrs
                ok &= all(g.get(k) == v for k, v in (attrs or {}).items())
            with torch.no_grad():
                ok &= gen == cache_free_greedy(model, prompt, steps)
            return ok, ""
        except Exception as e:
            return False, str(e)[:100]
    # StaticLayer: the whole 40-row buffer is returned; the new rows sit at cache_position.
    ok, msg = faithful(21, lambda: StaticLayer(40), "static")
    check(ok, "StaticLayer (update returns the max_cache_len buffer): keys/values equal the "
          "model's bit for bit, greedy tokens equal a recompute %s" % msg)
    # DynamicSlidingWindowLayer with a prefill longer than the window (P = 11 > W = 4).
    ok, msg = faithful(22, lambda: DynamicSlidingWindowLayer(4), "sliding", 4, {
        "cache_is_sliding": "1", "cache_sliding_window": "4", "sliding_window": "4",
        "scaling": repr(0.25), "softcap": "none"})
    check(ok, "DynamicSlidingWindowLayer, prefill 11 > window 4: keys/values bit for bit, "
          "layer attributes cache_is_sliding, cache_sliding_window, sliding_window, "
          "scaling, softcap %s" % msg)
    # A cache whose storage is not what the model computed (fp16-rounded fp32 keys, as a
    # quantised cache): the old check compared the storage with itself and passed.
    def refusal(seed, layer, name):
        torch.manual_seed(seed)
        model = TinyLM(truth=[])
        try:
            _decode(tmp, model, TinyCache(model.L, layer=layer), name, steps)
            return "no error"
        except RuntimeError as e:
            return str(e)
    msg = refusal(23, LossyLayer, "lossy")
    check("did not receive" in msg, "a cache storing other keys than the model computed is "
          "refused (%s)" % msg[:90])
    check(not [f for f in os.listdir(tmp) if f.startswith("lossy") or ".tmp" in f],
          "... and no trace is left behind")

    # A layer that drops one decode update (its length falls behind the position).
    class DroppingLayer(DynamicLayer):
        calls = 0

        def update(self, k, v, cache_kwargs=None):
            DroppingLayer.calls += 1
            if k.shape[-2] == 1 and DroppingLayer.calls == 8:
                return self.keys, self.values
            return DynamicLayer.update(self, k, v, cache_kwargs)
    msg = refusal(24, DroppingLayer, "dropping")
    check("has seen" in msg, "a layer whose length falls behind the position is refused "
          "(%s)" % msg[:90])


def unrotate_half(k, positions, inv_freq, scale):
    """Pre-RoPE keys from post-RoPE keys [H, T, d] (float64): undo HF's rotate_half
    rotation by positions x inv_freq on pairs (i, i + d/2), and the attention scaling."""
    k = torch.as_tensor(k, dtype=torch.float64)
    ang = torch.as_tensor(positions, dtype=torch.float64)[:, None] * \
        torch.as_tensor(inv_freq, dtype=torch.float64)[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    h = k.shape[-1] // 2
    rot = torch.cat([-k[..., h:], k[..., :h]], dim=-1)
    return (k * cos - rot * sin) / scale


def _rebuild_err(path, model, n_forwards, layer=1, layout="half", use_scale=True):
    """Largest error of the pre-RoPE keys rebuilt from the trace's RoPE metadata
    (/rope/inv_freq, rope_attention_scaling, the half pairing) against the model's own
    pre-RoPE keys (after Qwen3's k_norm), relative to their largest magnitude."""
    pre = torch.cat([x[4] for x in model.attn[0].truth[: model.L * n_forwards]
                     if x[0] == layer], dim=1).double()
    with h5py.File(path, "r") as f:
        if "rope/inv_freq" not in f:
            return float("inf")  # nothing to rebuild from
        k = fw.bf16_bits_to_f32(f["layers/L%02d/keys" % layer][...])
        inv = f["rope/inv_freq"][...]
        scale = float(f.attrs.get("rope_attention_scaling", "1.0")) if use_scale else 1.0
        pos = f["tokens/positions"][...]
    if layout == "interleaved":  # the wrong pairing, as a negative control
        perm = np.concatenate([np.arange(0, k.shape[-1], 2), np.arange(1, k.shape[-1], 2)])
        k = k[..., perm]
    got = unrotate_half(k, pos, inv, scale)
    return float((got - pre).abs().max() / pre.abs().max())


def test_main_variants(tmp):
    """dump_hf.main() on stand-in checkpoints covering defects 2-5 (see FAKE_MODELS)."""
    import json
    loaded, tok = install_fake_transformers()
    try:
        ptxt = os.path.join(tmp, "p.txt")
        with open(ptxt, "w") as f:
            f.write("Once upon a time\n")
        P = len(tok("Once upon a time")["input_ids"])
        check(P == 17, "variants: prompt of %d tokens, longer than fake/mistral's window 8" % P)
        steps = 6

        def run(name, *extra):
            out = os.path.join(tmp, name.replace("/", "_") + "-".join(extra))
            try:
                rc = dump_hf.main(["--model", name, "--prompts", ptxt, "--out", out,
                                   "--max-new-tokens", str(steps), "--dtype", "bfloat16",
                                   "--device", "cpu", "--chunk-tokens", "8"] + list(extra))
                return rc, os.path.join(out, "trace-00000.h5"), loaded[-1][4], ""
            except SystemExit as e:
                return None, os.path.join(out, "trace-00000.h5"), None, str(e.code)

        def common(tag, path, model, attn=eager_gqa_attention):
            ids = tok("Once upon a time")["input_ids"]
            with torch.no_grad():
                ref = cache_free_greedy(model, ids, steps, attn)
            with h5py.File(path, "r") as f:
                gen = [int(x) for x in f.attrs["generated_text"].split("|")]
            check(gen == ref[:len(gen)] and (len(gen) == steps or gen[-1] == 60),
                  "%s greedy tokens equal a cache-free recompute (%d tokens)" % (tag, len(gen)))
            check(_same_kv(path, model, 1 + steps), "%s keys/values equal the model's bf16 "
                  "bits" % tag)
            check(run_info(path) is not None or BIN is None, "%s fadkv-bench info reads the "
                  "trace" % tag)

        # llama3: the C reader's description, and /rope/inv_freq agreeing with it.
        rc, path, model, msg = run("fake/llama3")
        if check(rc == 0, "main(fake/llama3): exit 0 %s" % msg):
            common("[llama3]", path, model)
            with h5py.File(path, "r") as f:
                a = f.attrs
                inv = f["rope/inv_freq"][...] if "rope/inv_freq" in f else None
                ok = (a.get("rope_layout") == "half" and a.get("rope_type") == "llama3" and
                      float(a["rope_factor"]) == 8.0 and
                      float(a["rope_original_max_position"]) == 64.0 and
                      a.get("rope_pairing") == "half" and a.get("rope_rotary_dim") == "16" and
                      a.get("rope_attention_scaling") == "1.0" and
                      json.loads(a["rope_parameters"])["rope_type"] == "llama3")
                ok &= inv is not None and inv.dtype == np.float32 and np.array_equal(
                    inv, model.rotary_emb.inv_freq.numpy())
            check(ok, "[llama3] rope_layout/type/numbers, rope_parameters JSON, "
                  "/rope/inv_freq (float32) = the model's rotary inv_freq")
            # The README's llama3 rule from the recorded numbers gives the same frequencies.
            d = 16
            base = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
            wl = 2 * np.pi / base
            sm = (64 / wl - 1.0) / (4.0 - 1.0)
            rule = np.where(wl < 64 / 4.0, base, np.where(wl > 64 / 1.0, base / 8.0,
                                                           (1 - sm) * base / 8.0 + sm * base))
            check(inv is not None and np.allclose(inv, rule, rtol=1e-6, atol=0),
                  "[llama3] /rope/inv_freq equals the trace format's llama3 rule")
            e = _rebuild_err(path, model, 1 + steps)
            check(e < 2 ** -7, "[llama3] recorded metadata rebuilds the pre-RoPE keys to bf16 "
                  "tolerance (%.2g)" % e)
            e2 = _rebuild_err(path, model, 1 + steps, layout="interleaved")
            check(e2 > 0.05, "[llama3] ... and the wrong pairing does not (%.2g)" % e2)
        # YaRN: attention_factor scales cos and sin; no rope_layout (the C reader has no yarn).
        rc, path, model, msg = run("fake/yarn")
        if check(rc == 0, "main(fake/yarn): exit 0 %s" % msg):
            common("[yarn]", path, model)
            with h5py.File(path, "r") as f:
                a = f.attrs
                ok = ("rope_layout" not in a and "yarn" in a.get("rope_unsupported", "") and
                      float(a.get("rope_attention_scaling", 1)) == model.rotary_emb.attention_scaling
                      and float(a.get("rope_attention_scaling", 1)) > 1.1)
                sc = a.get("rope_attention_scaling")
            check(ok, "[yarn] rope_attention_scaling %s recorded, no rope_layout, "
                  "rope_unsupported says why" % sc)
            e = _rebuild_err(path, model, 1 + steps)
            check(e < 2 ** -7, "[yarn] recorded inv_freq + attention scaling rebuild the "
                  "pre-RoPE keys to bf16 tolerance (%.2g)" % e)
            e2 = _rebuild_err(path, model, 1 + steps, use_scale=False)
            check(e2 > 0.05, "[yarn] ... and without the attention scaling they do not "
                  "(%.2g)" % e2)
        # Qwen3: q/k RMS norms before RoPE; the rebuilt keys are the k_norm output.
        rc, path, model, msg = run("fake/qwen3")
        if check(rc == 0, "main(fake/qwen3): exit 0 %s" % msg):
            common("[qwen3]", path, model)
            e = _rebuild_err(path, model, 1 + steps, layer=2)
            with h5py.File(path, "r") as f:
                ok = f.attrs.get("rope_layout") == "half" and float(f.attrs["rope_theta"]) == 1e6
            check(ok and e < 2 ** -7, "[qwen3] rope_theta 1e6, rope_layout half; metadata "
                  "rebuilds the k_norm output (pre-RoPE keys) to bf16 tolerance (%.2g)" % e)
        # --pre-rope-keys: the k_norm (Qwen3) or k_proj (Llama) output, stored as
        # /layers/Lxx/keys_pre_rope, equal to the model's own pre-RoPE keys in bf16.
        for name in ("fake/qwen3", "fake/llama3"):
            rc, path, model, msg = run(name, "--pre-rope-keys")
            if not check(rc == 0, "main(%s, --pre-rope-keys): exit 0 %s" % (name, msg)):
                continue
            common("[%s, pre-RoPE keys]" % name, path, model)
            ok = True
            with h5py.File(path, "r") as f:
                ok &= f.attrs["pre_rope_keys"] == "yes"
                for l in range(3):
                    want = torch.cat([x[4] for x in model.attn[0].truth[: 3 * (1 + steps)]
                                      if x[0] == l], dim=1).to(torch.bfloat16)
                    ds = f["layers/L%02d/keys_pre_rope" % l]
                    ok &= ds.attrs["encoding"] == "bfloat16" and \
                        np.array_equal(bits(ds[...]), bits(want))
            check(ok, "[%s] /layers/Lxx/keys_pre_rope = the model's pre-RoPE keys (bf16 bits)"
                  % name)
        # Mistral v0.1: sliding_window = 8, no layer_types; prompt 17 > 8.
        rc, path, model, msg = run("fake/mistral")
        if check(rc == 0, "main(fake/mistral): exit 0 %s" % msg):
            common("[mistral]", path, model)
            with h5py.File(path, "r") as f:
                ok = all(f["layers/L%02d" % l].attrs.get("cache_is_sliding") == "1" and
                         f["layers/L%02d" % l].attrs.get("cache_sliding_window") == "8" and
                         f["layers/L%02d" % l].attrs.get("sliding_window") == "8"
                         for l in range(3))
            check(ok, "[mistral] every layer: cache_is_sliding 1, cache_sliding_window 8 "
                  "(read from the cache after prefill), sliding_window 8 (attention call)")
        # Soft-capping: sdpa ignores softcap, so it is refused; eager records it.
        rc, path, model, msg = run("fake/softcap")
        check(rc is None and "softcap" in msg and "eager" in msg and not os.path.exists(path),
              "[softcap] --attn-base sdpa is refused with a message (%s)" % msg[:80])
        before = EAGER_CALLS[0]
        rc, path, model, msg = run("fake/softcap", "--attn-base", "eager")
        if check(rc == 0 and EAGER_CALLS[0] > before,
                 "main(fake/softcap, --attn-base eager): exit 0, through the model file's "
                 "eager_attention_forward %s" % msg):
            common("[softcap, eager]", path, model, eager_attention_forward)
            with h5py.File(path, "r") as f:
                g = f["layers/L00"].attrs
                ok = g.get("softcap") == "30.0" and g.get("scaling") == "0.25" and \
                    g.get("sliding_window") == "none" and g.get("cache_is_sliding") == "0"
                ok &= f.attrs["attn_implementation"] == "fadkv_capture(eager)"
            check(ok, "[softcap, eager] layer attributes softcap 30.0, scaling 0.25, "
                  "sliding_window none")
        # Dynamic RoPE: refused with a message.
        rc, path, model, msg = run("fake/dynamic")
        check(rc is None and "dynamic" in msg and "refuses" in msg,
              "[dynamic] RoPE type dynamic refused (%s)" % msg[:90])
        # The registry contract of the stand-in: item assignment is local and ignored.
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        ALL_ATTENTION_FUNCTIONS["local_only"] = eager_gqa_attention
        try:
            sys.modules["transformers"].AutoModelForCausalLM.from_pretrained(
                "fake/tiny", attn_implementation="local_only")
            ok = False
        except ValueError:
            ok = True
        check(ok, "stand-in: an attention function set by item assignment is not seen by "
              "the model (only register() is)")
    finally:
        for k in FAKE_MODULES:
            sys.modules.pop(k, None)


def test_old_releases(tmp):
    """Defect 5: releases before 4.48 (no AttentionInterface) exit with a message naming
    the release and the supported ones."""
    ptxt = os.path.join(tmp, "p.txt")
    with open(ptxt, "w") as f:
        f.write("hello\n")
    install_fake_transformers(version="4.46.3", attention_interface=False)
    try:
        try:
            dump_hf.main(["--model", "fake/tiny", "--prompts", ptxt, "--out",
                          os.path.join(tmp, "old"), "--device", "cpu"])
            msg = "no exit"
        except SystemExit as e:
            msg = str(e.code)
        check("4.46.3" in msg and "4.47" in msg and "4.56" in msg,
              "transformers 4.46.3: clear exit message (%s)" % msg[:120])
    finally:
        for k in FAKE_MODULES:
            sys.modules.pop(k, None)


def run_sweep(tmp, name, body):
    """Runs a sweep `name` (one job, attention at every step) whose datasets and codecs are
    `body`, in tmp; returns its results directory and the process result."""
    cfg = os.path.join(tmp, name + ".toml")
    res = os.path.join(tmp, name + "-results")
    with open(cfg, "w") as f:
        f.write('[sweep]\nname = "%s"\noutput = "%s"\njobs = 1\nattention = true\n'
                'attn_stride = 1\n\n%s' % (name, res, body))
    return res, subprocess.run([BIN, "--config", cfg], capture_output=True, text=True, cwd=tmp)


def test_rope_attrs():
    """dump_hf.rope_attrs: Hugging Face's llama3 rope_scaling becomes the trace's llama3
    numbers; a scaling the format cannot describe, or a partial rotary dimension, writes no
    rope_layout (pre-RoPE codecs then refuse the trace) and says why; the RoPE dict is
    always kept as JSON (rope_parameters). Dynamic types are refused."""
    import json
    import types
    shape = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, hidden_size=32)
    l3p = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    l3 = types.SimpleNamespace(rope_scaling=dict(l3p), rope_theta=5e5, **shape)
    a, data = dump_hf.rope_attrs(l3)
    want = {"rope_layout": "half", "rope_type": "llama3", "rope_factor": 32.0,
            "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
            "rope_original_max_position": 8192.0, "rope_pairing": "half",
            "rope_rotary_dim": 16,
            "rope_parameters": json.dumps(dict(l3p, rope_theta=5e5), sort_keys=True)}
    check(a == want and data == {}, "rope_attrs: llama3 scaling (%r)" % a)
    new = types.SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                **shape)
    a, _ = dump_hf.rope_attrs(new)
    check(a["rope_layout"] == "half" and a["rope_type"] == "default" and
          json.loads(a["rope_parameters"])["rope_theta"] == 1e6,
          "rope_attrs: rope_parameters of newer transformers, default type")
    for cfg in (types.SimpleNamespace(rope_scaling={"type": "yarn", "factor": 4.0},
                                      rope_theta=1e4, **shape),
                types.SimpleNamespace(partial_rotary_factor=0.5, rope_theta=1e4, **shape)):
        a, _ = dump_hf.rope_attrs(cfg)
        check("rope_layout" not in a and "rope_unsupported" in a and "rope_parameters" in a,
              "rope_attrs: no rope_layout for %r" % a)
    for rt in ("dynamic", "longrope"):
        try:
            dump_hf.rope_attrs(types.SimpleNamespace(
                rope_scaling={"rope_type": rt, "factor": 2.0}, rope_theta=1e4, **shape))
            msg = ""
        except ValueError as e:
            msg = str(e)
        check("refuses" in msg and rt in msg, "rope_attrs refuses rope_type %s (%s)"
              % (rt, msg[:70]))


def test_nested_rope():
    """A per-layer-type rope_parameters (transformers 5, Gemma 3) gives each layer its
    rope_theta and no root rope_theta -- never 0.0 (the old dumper's model_shape returned
    rope_theta = 0.0 for it)."""
    import types
    shape = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, hidden_size=32)
    nested = types.SimpleNamespace(
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        sliding_window=8, **shape)
    L, hq, hkv, d, theta, la = dump_hf.model_shape(nested)
    check(theta is None and la[0].get("rope_theta") == "10000.0" and
          la[1].get("rope_theta") == "1000000.0",
          "nested per-layer-type rope_parameters: no root rope_theta (got %r), each layer "
          "its own" % (theta,))
    a, _ = dump_hf.rope_attrs(nested)
    check("rope_layout" not in a and "differ" in a["rope_unsupported"],
          "nested, differing rope_parameters: no rope_layout (%s)" % a.get("rope_unsupported"))


def test_pca_pre_rope(calib, trace, tmp):
    """The dumped traces carry their RoPE: train-basis un-rotates the calibration trace's
    keys, pca with pre_rope = 1 replays the other trace at full rank to rounding (un-rotate,
    project, rotate back), and at rank 4 the pre-RoPE basis fits the stand-in model's keys
    better than the post-RoPE one (about 0.58 vs 0.73 here, deterministic): un-rotating
    with the trace's rotate_half pairs recovers k = W_k h, whose directions do not turn
    with the position."""
    if BIN is None:
        return
    basis = os.path.join(tmp, "basis.h5")
    r = subprocess.run([BIN, "train-basis", "--out", basis, calib], capture_output=True,
                       text=True)
    check(r.returncode == 0 and "pre-RoPE keys: yes" in r.stderr,
          "train-basis on a dumped trace trains pre-RoPE keys (%s)" % r.stderr.strip()[:120])
    res, r = run_sweep(tmp, "pca", '[[dataset]]\nname = "hf"\ntraces = ["%s"]\nbasis = "%s"\n'
                       '[defaults]\nn_b = 0\ncoef = "fp32"\n[[codec]]\nname = "pca"\n'
                       'grid = { rank = [16, 4], pre_rope = [false, true] }\n' % (trace, basis))
    if not check(r.returncode == 0, "pca sweep with pre_rope on a dumped trace: exit 0"):
        print(r.stdout + r.stderr)
        return
    import csv
    rows = list(csv.DictReader(open(os.path.join(res, "cells.csv"))))
    err = {(int(x["rank"]), x["pre_rope"]): float(x["rel_err_k"]) for x in rows}
    check(err[(16, "true")] < 1e-4 and err[(16, "false")] < 1e-4,
          "pca at full rank 16: keys back to rounding, pre- and post-RoPE (%g, %g)"
          % (err[(16, "true")], err[(16, "false")]))
    check(err[(4, "true")] < err[(4, "false")] - 0.05,
          "pca at rank 4: pre-RoPE keys fit better than post-RoPE (%.3f vs %.3f)"
          % (err[(4, "true")], err[(4, "false")]))


def test_sweep(traces, dictionary, tmp):
    """The dumped traces replay through a sweep with the imported Lexico dictionary: the C
    reader decodes every layer (bf16 and fp16 widening, finiteness check), `full` is exact
    and `lexico` (OMP, s = 4 of 40 atoms) has a nonzero error below 1."""
    if BIN is None:
        return
    res, r = run_sweep(tmp, "python-tools",
                       '[[dataset]]\nname = "tiny"\ntraces = [%s]\n'
                       'dictionary = "%s"\ndefaults = { s = 4, n = 8, n_b = 4 }\n\n'
                       '[[codec]]\nname = "full"\n\n[[codec]]\nname = "lexico"\n'
                       % (", ".join('"%s"' % t for t in traces), dictionary))
    if not check(r.returncode == 0, "sweep over the dumped traces with the imported "
                 "dictionary: exit 0"):
        print(r.stdout + r.stderr)
        return
    rows = open(os.path.join(res, "summary.csv")).read().splitlines()
    head = rows[0].split(",")
    col = {n: head.index(n) for n in ("codec", "trace", "layer", "kind", "rel_err_mean",
                                      "n_vectors")}
    cells = [dict((n, row.split(",")[i]) for n, i in col.items()) for row in rows[1:]]
    names = {os.path.basename(t) for t in traces}
    check({c["trace"] for c in cells} == names and len(cells) == 2 * len(traces) * 3 * 2 and
          all(c["n_vectors"] == "24" for c in cells),
          "sweep: one row per (codec, trace, layer, kind), each 2 heads x (16 - n_b 4) "
          "vectors")
    full = [float(c["rel_err_mean"]) for c in cells if c["codec"] == "full"]
    lex = [float(c["rel_err_mean"]) for c in cells if c["codec"] == "lexico"]
    check(all(e == 0 for e in full) and all(0 < e < 1 for e in lex),
          "sweep: full is exact, lexico error in (0, 1) (%.3f .. %.3f)" % (min(lex), max(lex)))
    # The three traces hold the same model's tensors rounded to bf16, fp16 and fp32: if the
    # C reader decoded one encoding wrongly its error would stand apart.
    by = {}
    for c in cells:
        if c["codec"] == "lexico":
            by.setdefault((c["layer"], c["kind"]), []).append(float(c["rel_err_mean"]))
    spread = max(max(v) - min(v) for v in by.values())
    check(spread < 0.01, "sweep: lexico errors of the bf16/fp16/fp32 traces agree per "
          "(layer, kind) within 0.01 (max spread %.2g)" % spread)


def guarded(fn, *args):
    """Run one test function; an exception is a failure, not an abort of the suite."""
    try:
        fn(*args)
    except Exception as e:
        import traceback
        traceback.print_exc()
        check(False, "%s raised %s: %s" % (fn.__name__, type(e).__name__, e))
        for k in FAKE_MODULES:
            sys.modules.pop(k, None)


def main():
    check("transformers" not in sys.modules, "dump_hf imports without transformers")
    with tempfile.TemporaryDirectory() as tmp:
        dumps = os.path.join(tmp, "dumps")
        os.mkdir(dumps)
        traces = [test_dump(dumps, enc) for enc in ("bfloat16", "float16", "float32")]
        test_dump(dumps, "bfloat16", queries=False)  # (kept out of the sweep: no queries)
        test_sampling()
        guarded(test_rope_attrs)
        guarded(test_nested_rope)
        guards = os.path.join(tmp, "guards")
        os.mkdir(guards)
        test_writer_guards(guards)
        imports = os.path.join(tmp, "imports")
        os.mkdir(imports)
        test_import(imports)
        test_sweep(traces, os.path.join(imports, "lexico-0.h5"), tmp)
        fake = os.path.join(tmp, "fake")
        os.mkdir(fake)
        guarded(test_main, fake)
        for name, fn in (("cache", test_cache_contracts), ("variants", test_main_variants),
                         ("old", test_old_releases)):
            d = os.path.join(tmp, name)
            os.mkdir(d)
            guarded(fn, d)
    return finish()


def finish():
    """Exit status of a suite of check() calls: 0 all passed, 1 some failed."""
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
