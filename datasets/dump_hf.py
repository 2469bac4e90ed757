#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Dump fadkv-bench traces (trace format v1, datasets/README.md) from a Hugging Face causal LM.

usage:
  dump_hf.py --model NAME_OR_PATH --prompts FILE --out DIR [--max-new-tokens N]
             [--greedy | --temperature T --top-p P --seed S]
             [--dtype bfloat16|float16|float32] [--device cpu|cuda] [--no-queries]
             [--chat-template] [--attn-base sdpa|eager] [--chunk-tokens N] [--resume]
             [--pre-rope-keys]

FILE is a .txt file (one prompt per line; blank lines skipped) or a .jsonl file (one JSON
object per line with a "prompt" field). One trace per prompt is written to
DIR/trace-NNNNN.h5 (under a temporary name, renamed when complete), and DIR/manifest.jsonl
lists them.

Every prompt is decoded with batch size 1: one prefill forward over the prompt, then one
forward per generated token (greedy, or temperature + top-p sampling with a seeded
generator). After every forward the dumper records, for every layer:
  * keys and values of the new tokens: the key_states / value_states the attention layer
    hands to Cache.update (a wrapper of the cache instance's update records them), i.e.
    AFTER RoPE, whatever the cache layer does with them (DynamicLayer appends and returns
    its own storage, StaticLayer writes them into a max_cache_len buffer at
    cache_position, DynamicSlidingWindowLayer drops the oldest). Each layer's length must
    equal the last position + 1, and the key/value tensors the attention function
    received must hold the recorded rows bit for bit (else: quantised or offloaded cache);
  * the post-RoPE queries of the new tokens, captured by a custom attention function
    registered globally through transformers' AttentionInterface.register (it records the
    query and calls the stock "sdpa" or the model's "eager" attention), selected with
    attn_implementation="fadkv_capture";
  * after the prefill, each layer group gets the attention call's scaling, softcap and
    sliding_window, and the cache layer's is_sliding / sliding_window.
The RoPE the model used is described by attributes and by /rope/inv_freq (rope_attrs).
Tensors are stored losslessly in the model dtype (bf16 as raw uint16 bits, encoding
"bfloat16"), appended step by step to chunked resizable datasets, so memory does not grow
with the trace beyond the model's own KV cache.

transformers is imported lazily (in main()), so the capture function, the decode loop and
the writer can be tested without it (tests/test_python_tools.py); main() also accepts a
model object (tests/test_dump_hf_transformers.py). Targets transformers >= 4.56 (cache
layers API, AttentionInterface, AttentionMaskInterface); 4.48 - 4.55 run with a warning,
untested; releases without AttentionInterface (<= 4.47) exit with a message. See
DUMPING.md.
"""
import argparse
import hashlib
import inspect
import json
import os
import sys

DUMPER_VERSION = "1.1.0"
CAPTURE_NAME = "fadkv_capture"
MIN_TRANSFORMERS = (4, 56)

sys.dont_write_bytecode = True  # no __pycache__ next to the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fkv_trace_writer  # noqa: E402  (numpy + h5py only)


class Capture:
    """What one forward pass handed to the cache and to the attention function, by layer.

    new_keys[l] / new_values[l] are the key_states / value_states [B, H_kv, t, d] of layer l
    as passed to Cache.update (the tokens of this forward, post-RoPE): what the trace stores.
    queries[l] is the query [B, H_q, t, d] (post-RoPE) the attention function received;
    keys[l] / values[l] are the key/value tensors it received (the cache's output, before
    repeat_kv), kept only to check that attention saw the recorded tokens. attn_kwargs[l]
    holds the scaling, softcap and sliding_window of layer l's attention call (the same at
    every call, or the capture refuses)."""

    ATTN_KWARGS = ("scaling", "softcap", "sliding_window")

    def __init__(self, want_queries=True):
        self.want_queries = bool(want_queries)
        self.queries = {}
        self.keys = {}
        self.values = {}
        self.new_keys = {}
        self.new_values = {}
        self.pre_rope = {}  # layer -> keys before RoPE [B, H_kv, t, d] (--pre-rope-keys)
        self.attn_kwargs = {}  # layer -> {scaling, softcap, sliding_window}, kept across forwards
        self.calls = 0    # attention calls since construction (all forwards)
        self.updates = 0  # Cache.update calls since construction

    def reset(self):
        for d in (self.queries, self.keys, self.values, self.new_keys, self.new_values,
                  self.pre_rope):
            d.clear()

    def record(self, module, query, key, value, kwargs=None):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError("attention module %s has no layer_idx; cannot attribute the "
                               "captured query to a layer" % type(module).__name__)
        layer = int(layer)
        if layer in self.keys:
            raise RuntimeError("layer %d: attention called twice in one forward (shared or "
                               "cross-attention layers are not supported)" % layer)
        kw = {}
        for name in self.ATTN_KWARGS:
            x = (kwargs or {}).get(name)
            kw[name] = None if x is None else float(x) if name != "sliding_window" else int(x)
        prev = self.attn_kwargs.setdefault(layer, kw)
        if prev != kw:
            raise RuntimeError("layer %d: the attention call's %s changed from %s to %s "
                               "between forwards" % (layer, ", ".join(self.ATTN_KWARGS),
                                                      prev, kw))
        if self.want_queries:
            self.queries[layer] = query.detach()
        self.keys[layer] = key.detach()
        self.values[layer] = value.detach()
        self.calls += 1

    def record_pre_rope(self, layer, keys):
        if layer in self.pre_rope:
            raise RuntimeError("layer %d: k_proj/k_norm called twice in one forward" % layer)
        self.pre_rope[layer] = keys

    def record_update(self, layer, key_states, value_states):
        layer = int(layer)
        if layer in self.new_keys:
            raise RuntimeError("layer %d: Cache.update called twice in one forward (shared "
                               "KV layers are not supported)" % layer)
        self.new_keys[layer] = key_states.detach()
        self.new_values[layer] = value_states.detach()
        self.updates += 1


def hook_cache_update(cache, capture):
    """Wrap cache.update (on this instance) so that every call first hands its key_states
    and value_states -- the new tokens, post-RoPE, before the cache stores them -- to
    capture.record_update. transformers calls it as
    past_key_values.update(key_states, value_states, layer_idx, cache_kwargs). Returns the
    cache."""
    orig = cache.update
    if getattr(orig, "_fadkv_capture", None) is capture:
        return cache

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        capture.record_update(layer_idx, key_states, value_states)
        return orig(key_states, value_states, layer_idx, *args, **kwargs)

    update._fadkv_capture = capture
    cache.update = update
    return cache


def resolve_base_attention(base, module):
    """The attention function the capture wrapper calls: a callable as is; "eager" is the
    model file's own eager_attention_forward (transformers keeps eager out of
    ALL_ATTENTION_FUNCTIONS); any other name is looked up in ALL_ATTENTION_FUNCTIONS."""
    if callable(base):
        return base
    if base == "eager":
        mod = sys.modules.get(type(module).__module__)
        fn = getattr(mod, "eager_attention_forward", None)
        if fn is None:
            raise RuntimeError("%s defines no eager_attention_forward; use --attn-base sdpa"
                               % type(module).__module__)
        return fn
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    return ALL_ATTENTION_FUNCTIONS[base]


def make_capture_attention(capture, base="sdpa"):
    """Return the attention function registered as CAPTURE_NAME: it records the post-RoPE
    query (and the key/value it receives) in `capture`, then runs `base` unchanged. It is
    called by transformers as fn(module, query, key, value, attention_mask, scaling=...,
    dropout=..., **kwargs) with query [B, H_q, t, d]."""
    resolved = {}

    def fadkv_capture_attention(module, query, key, value, attention_mask, **kwargs):
        if base == "sdpa" and kwargs.get("softcap") is not None:
            raise RuntimeError("layer %s: the attention call sets softcap = %s, which sdpa "
                               "ignores (the model would run without its logit soft-capping); "
                               "use --attn-base eager" % (getattr(module, "layer_idx", "?"),
                                                          kwargs["softcap"]))
        capture.record(module, query, key, value, kwargs)
        key_t = type(module)
        fn = resolved.get(key_t)
        if fn is None:
            fn = resolved[key_t] = resolve_base_attention(base, module)
        return fn(module, query, key, value, attention_mask, **kwargs)

    return fadkv_capture_attention


def cache_seq_length(cache, layer):
    """Tokens seen by `layer` of the cache (its get_seq_length: the cumulative count, also
    for sliding-window layers), or None when the cache cannot tell."""
    layers = getattr(cache, "layers", None)
    if layers is not None and layer < len(layers) and hasattr(layers[layer], "get_seq_length"):
        return int(layers[layer].get_seq_length())
    if hasattr(cache, "get_seq_length"):
        try:
            return int(cache.get_seq_length(layer))
        except TypeError:
            return None
    return None


def new_kv(cache, capture, layer, positions):
    """Keys and values [H_kv, t, d] of the t tokens of the last forward in `layer`: the
    key_states / value_states handed to Cache.update (recorded by hook_cache_update), so the
    result does not depend on where the cache keeps them (appended for DynamicLayer, at
    cache_position in a StaticLayer's max_cache_len buffer, dropped by a sliding window).
    Checks that the layer has seen exactly positions[-1] + 1 tokens, and that the tensors
    the attention function received hold these keys and values bit for bit: at the end
    (dynamic and sliding-window layers), or at positions[0]..positions[-1] (a static buffer
    longer than the sequence)."""
    import torch  # the caller has torch (tensors come from a torch model)
    t = len(positions)
    end = int(positions[-1]) + 1
    k, v = capture.new_keys.get(layer), capture.new_values.get(layer)
    if k is None or v is None:
        raise RuntimeError("layer %d: Cache.update was not called in this forward (is the "
                           "cache hooked with hook_cache_update?)" % layer)
    if k.dim() != 4 or k.shape[0] != 1 or k.shape[-2] != t or v.shape[:-1] != k.shape[:-1]:
        raise RuntimeError("layer %d: Cache.update received keys %s / values %s, expected "
                           "[1, H_kv, %d, d]" % (layer, tuple(k.shape), tuple(v.shape), t))
    n = cache_seq_length(cache, layer)
    if n is not None and n != end:
        raise RuntimeError("layer %d: the cache has seen %d tokens after this forward, "
                           "expected %d (last position + 1)" % (layer, n, end))
    ak, av = capture.keys.get(layer), capture.values.get(layer)
    if ak is not None:
        La = ak.shape[-2]
        lo = end - t if La > end else La - t
        ok = (ak.dim() == 4 and lo >= 0 and ak.dtype == k.dtype and av.dtype == v.dtype and
              ak.shape[1] == k.shape[1] and
              torch.equal(ak[:, :, lo:lo + t, :], k) and torch.equal(av[:, :, lo:lo + t, :], v))
        if not ok:
            raise RuntimeError("layer %d: the attention function did not receive the keys/"
                               "values handed to Cache.update (quantised or offloaded cache?)"
                               % layer)
    return k[0], v[0]


def layer_call_attrs(cache, capture, layer):
    """Attributes of /layers/Lxx known after the prefill: the attention call's scaling,
    softcap and sliding_window ("none" when not passed), and the cache layer's is_sliding
    and sliding_window (cache_is_sliding, cache_sliding_window; absent when the cache
    layer does not say)."""
    out = {}
    kw = capture.attn_kwargs.get(layer)
    if kw is not None:
        for name in Capture.ATTN_KWARGS:
            out[name] = "none" if kw[name] is None else repr(kw[name])
    layers = getattr(cache, "layers", None)
    if layers is not None and layer < len(layers) and hasattr(layers[layer], "is_sliding"):
        lay = layers[layer]
        out["cache_is_sliding"] = int(bool(lay.is_sliding))
        if lay.is_sliding and getattr(lay, "sliding_window", None) is not None:
            out["cache_sliding_window"] = int(lay.sliding_window)
    return out


def hook_pre_rope_keys(model, capture):
    """Forward hooks recording, per layer, the keys before RoPE: the output of the
    attention module's k_norm when it has one (Qwen3, OLMo 2 ...), else of k_proj,
    reshaped to [B, H_kv, t, d]. Attention modules are the modules with layer_idx and
    k_proj. Returns the hook handles."""
    handles = []
    for _, m in model.named_modules():
        if getattr(m, "layer_idx", None) is None or not hasattr(m, "k_proj"):
            continue
        src = getattr(m, "k_norm", None)
        if not hasattr(src, "register_forward_hook"):
            src = m.k_proj
        d = int(getattr(m, "head_dim", 0) or 0)

        def hook(mod, inputs, out, layer=int(m.layer_idx), d=d):
            x = out.detach()
            if x.dim() == 3:  # [B, t, H_kv * d] from k_proj
                x = x.view(x.shape[0], x.shape[1], -1, d)
            capture.record_pre_rope(layer, x.transpose(1, 2))
        handles.append(src.register_forward_hook(hook))
    if not handles:
        raise RuntimeError("--pre-rope-keys: no attention module with layer_idx and k_proj")
    return handles


def record_step(writer, cache, capture, positions, phase, ids):
    """Append the tokens of the last forward (positions, phase 0/1, ids) to the trace."""
    t = len(positions)
    keys, values, queries = [], [], []
    for layer in range(writer.L):
        k, v = new_kv(cache, capture, layer, positions)
        keys.append(k)
        values.append(v)
        if writer.queries:
            q = capture.queries.get(layer)
            if q is None:
                raise RuntimeError("layer %d: no query captured; the model did not call the "
                                   "%s attention function" % (layer, CAPTURE_NAME))
            if q.dim() != 4 or q.shape[0] != 1 or q.shape[-2] != t:
                raise RuntimeError("layer %d: captured query has shape %s, expected "
                                   "[1, H_q, %d, d]" % (layer, tuple(q.shape), t))
            queries.append(q[0])
    pre = None
    if writer.pre_rope_keys:
        pre = []
        for layer in range(writer.L):
            k = capture.pre_rope.get(layer)
            if k is None or k.dim() != 4 or k.shape[0] != 1 or k.shape[-2] != t:
                raise RuntimeError("layer %d: no pre-RoPE keys [1, H_kv, %d, d] captured (got "
                                   "%s)" % (layer, t, None if k is None else tuple(k.shape)))
            pre.append(k[0])
    writer.append(positions, phase, keys, values, queries if writer.queries else None, ids,
                  keys_pre_rope=pre)


class Sampler:
    """Next-token choice from a logits vector: greedy (argmax) or temperature + top-p
    (nucleus) sampling with its own CPU generator seeded with `seed`."""

    def __init__(self, greedy=True, temperature=1.0, top_p=1.0, seed=0):
        if not greedy and (temperature <= 0 or not 0 < top_p <= 1):
            raise ValueError("sampling needs temperature > 0 and 0 < top_p <= 1")
        self.greedy = bool(greedy)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.gen = None
        self.reset()

    def reset(self):
        if not self.greedy:
            import torch
            self.gen = torch.Generator(device="cpu")
            self.gen.manual_seed(self.seed)

    def describe(self):
        if self.greedy:
            return {"mode": "greedy"}
        return {"mode": "sample", "temperature": self.temperature, "top_p": self.top_p,
                "seed": self.seed}

    def __call__(self, logits):
        import torch
        logits = logits.detach().float().reshape(-1).cpu()
        if self.greedy:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / self.temperature, dim=-1)
        p, order = torch.sort(probs, descending=True)
        keep = (torch.cumsum(p, 0) - p) < self.top_p
        keep[0] = True
        p = torch.where(keep, p, torch.zeros_like(p))
        j = torch.multinomial(p / p.sum(), 1, generator=self.gen)
        return int(order[j])


def decode_and_record(forward, cache, capture, writer, prompt_ids, max_new_tokens, sampler,
                      eos_ids=()):
    """Prefill `prompt_ids`, then decode up to max_new_tokens tokens, recording every
    forward into `writer`. forward(input_ids LongTensor [1, t]) runs the model on the new
    tokens with `cache` and returns the logits of the last position. Each sampled token is
    fed back (and recorded as a decode token) unless it is an end-of-sequence id, which
    stops decoding without being fed. The cache is hooked (hook_cache_update) into
    `capture` first. After the prefill, each layer group gets the attributes of
    layer_call_attrs. Returns (generated ids, stop reason)."""
    import torch
    hook_cache_update(cache, capture)
    P = len(prompt_ids)
    if P < 1:
        raise ValueError("empty prompt (no token)")
    capture.reset()
    logits = forward(torch.tensor([list(prompt_ids)], dtype=torch.long))
    record_step(writer, cache, capture, list(range(P)), 0, list(prompt_ids))
    for layer in range(writer.L):
        for name, value in layer_call_attrs(cache, capture, layer).items():
            writer.set_layer_attr(layer, name, value)
    generated, reason = [], "max_new_tokens"
    eos = set(int(e) for e in eos_ids)
    for _ in range(max_new_tokens):
        nxt = sampler(logits)
        generated.append(nxt)
        if nxt in eos:
            reason = "eos"
            break
        capture.reset()
        logits = forward(torch.tensor([[nxt]], dtype=torch.long))
        record_step(writer, cache, capture, [writer.T], 1, [nxt])
    capture.reset()
    return generated, reason


def read_prompts(path):
    """Prompts from a .txt (one per line, blank lines skipped) or .jsonl ("prompt" field)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if path.endswith(".jsonl"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit("%s:%d:%d: invalid JSON: %s" % (path, n, e.colno, e.msg))
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise SystemExit('%s:%d:1: expected an object with a string "prompt" field'
                                     % (path, n))
                out.append(obj["prompt"])
            else:
                out.append(line.rstrip("\n").rstrip("\r"))
    if not out:
        raise SystemExit("%s: no prompt found" % path)
    return out


DYNAMIC_ROPE = ("dynamic", "longrope")


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _nested_rope(rp):
    """True for a per-layer-type rope_parameters dict ({"full_attention": {...}, ...})."""
    return isinstance(rp, dict) and bool(rp) and all(isinstance(v, dict) for v in rp.values())


def rope_parameters(config):
    """The model's RoPE parameters as a dict: config.rope_parameters (transformers 5; may be
    nested per layer type), else config.rope_scaling with config.rope_theta added
    (transformers 4.x). {} when the config says nothing."""
    cfg = _text_config(config)
    rp = getattr(cfg, "rope_parameters", None)
    rp = dict(rp) if isinstance(rp, dict) and rp else dict(getattr(cfg, "rope_scaling", None) or {})
    theta = getattr(cfg, "rope_theta", None)
    if theta is not None and not _nested_rope(rp):
        rp.setdefault("rope_theta", theta)
    return rp


def _rope_type(rp):
    return rp.get("rope_type", rp.get("type")) or "default"


def model_shape(config):
    """(L, H_q, H_kv, d, rope_theta, layer attrs) from a transformers config. rope_theta is
    None when the config gives none, or when per-layer-type RoPE parameters disagree on it
    (each layer group then carries its own rope_theta and rope_parameters)."""
    cfg = _text_config(config)
    L = int(cfg.num_hidden_layers)
    hq = int(cfg.num_attention_heads)
    hkv = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
    rp = rope_parameters(cfg)
    types = getattr(cfg, "layer_types", None)
    per_type = None
    if _nested_rope(rp):
        thetas = set(v.get("rope_theta") for v in rp.values())
        theta = thetas.pop() if len(thetas) == 1 else None
        per_type = rp
    else:
        theta = rp.get("rope_theta")
    layer_attrs = {}
    for l in range(L):
        a = {"layer_idx": l}
        if types and l < len(types):
            a["attention_type"] = types[l]
            if "sliding" in str(types[l]) and getattr(cfg, "sliding_window", None):
                a["config_sliding_window"] = cfg.sliding_window
        if per_type is not None:
            sub = per_type.get(types[l]) if types and l < len(types) else None
            if sub is None:
                raise ValueError("layer %d: rope_parameters is given per layer type (%s) but "
                                 "the layer's type %r has none"
                                 % (l, ", ".join(sorted(per_type)),
                                    types[l] if types and l < len(types) else None))
            a["rope_parameters"] = json.dumps(sub, sort_keys=True, default=str)
            if sub.get("rope_theta") is not None:
                a["rope_theta"] = repr(float(sub["rope_theta"]))
        layer_attrs[l] = a
    return L, hq, hkv, d, float(theta) if theta is not None else None, layer_attrs


def rotary_modules(model):
    """[(name, module)] of the model's rotary embeddings: modules with an inv_freq tensor
    (LlamaRotaryEmbedding and its copies hold inv_freq [rotary_dim / 2] and
    attention_scaling, the factor cos and sin are multiplied by)."""
    if model is None or not hasattr(model, "named_modules"):
        return []
    out = []
    for name, m in model.named_modules():
        f = getattr(m, "inv_freq", None)
        if f is not None and hasattr(f, "shape") and getattr(f, "dim", lambda: 0)() == 1:
            out.append((name, m))
    return out


def rope_attrs(config, model=None):
    """The trace's RoPE description: (root attributes, {dataset path: (float32 array, attrs)}).

    Always written: rope_parameters (JSON of the config's RoPE dict, rope_theta included)
    and rope_pairing = "half" (Hugging Face's rotate_half pairs channels (i, i + r/2)).
    From the model's rotary embedding (when `model` is given): /rope/inv_freq (float32, the
    frequencies the model rotates with, one per pair), rope_rotary_dim (2 x its length)
    and rope_attention_scaling (its attention_scaling: cos and sin are multiplied by it,
    1 except for YaRN and longrope). The C reader's own description -- rope_layout = "half",
    rope_type and the llama3 numbers -- is written only when it is exact: type default or
    llama3, every channel rotated, attention scaling 1, one set of parameters for every
    layer; otherwise rope_unsupported says why (pre-RoPE codecs then refuse the trace, but
    the frequencies above still describe it). Dynamic types (rope_type "dynamic",
    "longrope"), whose frequencies change with the sequence length, raise ValueError."""
    import numpy as np
    cfg = _text_config(config)
    rp = rope_parameters(cfg)
    out = {"rope_parameters": json.dumps(rp, sort_keys=True, default=str),
           "rope_pairing": "half"}
    datasets = {}
    nested = _nested_rope(rp)
    subs = list(rp.values()) if nested else [rp]
    for sub in subs:
        if _rope_type(sub) in DYNAMIC_ROPE:
            raise ValueError("RoPE type %r rescales its frequencies with the sequence length "
                             "(transformers' dynamic_rope_update), so no fixed set of "
                             "frequencies describes the trace; dump_hf.py refuses it"
                             % _rope_type(sub))
    rotary = rotary_modules(model)
    for name, m in rotary:
        if str(getattr(m, "rope_type", "default")) in DYNAMIC_ROPE:
            raise ValueError("rotary embedding %s has rope_type %r, which rescales its "
                             "frequencies with the sequence length; dump_hf.py refuses it"
                             % (name or "<model>", m.rope_type))
    why = []
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    partial = float(getattr(cfg, "partial_rotary_factor", 1.0) or 1.0)
    rotary_dim = int(int(d) * partial)
    scaling = 1.0
    if rotary:
        freqs = [np.asarray(m.inv_freq.detach().float().cpu().numpy(), dtype=np.float32)
                 for _, m in rotary]
        scales = [float(getattr(m, "attention_scaling", 1.0) or 1.0) for _, m in rotary]
        same = all(f.shape == freqs[0].shape and np.array_equal(f, freqs[0]) for f in freqs)
        if same and len(set(scales)) == 1:
            datasets["/rope/inv_freq"] = (freqs[0], {"module": rotary[0][0] or "<model>"})
            scaling = scales[0]
            out["rope_attention_scaling"] = repr(scaling)
        else:
            for (name, _), f, sc in zip(rotary, freqs, scales):
                datasets["/rope/%s/inv_freq" % (name.replace(".", "_") or "model")] = (
                    f, {"module": name, "attention_scaling": repr(sc)})
            why.append("several rotary embeddings with different frequencies")
        rotary_dim = 2 * int(freqs[0].shape[0])
    out["rope_rotary_dim"] = rotary_dim
    if nested:
        if all(sub == subs[0] for sub in subs):
            rp = subs[0]
        else:
            why.append("per-layer-type RoPE parameters differ (see each layer group)")
    rtype = _rope_type(rp)
    if rtype not in ("default", "llama3"):
        why.append("rope_type %r" % rtype)
    if rotary_dim != int(d):
        why.append("rotary dimension %d of head_dim %d" % (rotary_dim, int(d)))
    if scaling != 1.0:
        why.append("attention scaling %r" % scaling)
    if rp.get("rope_theta") is None and not why:
        why.append("no rope_theta")
    if why:
        out["rope_unsupported"] = "; ".join(why)
        return out, datasets
    out.update({"rope_layout": "half", "rope_type": rtype})
    if rtype == "llama3":
        out.update({"rope_factor": float(rp["factor"]),
                    "rope_low_freq_factor": float(rp["low_freq_factor"]),
                    "rope_high_freq_factor": float(rp["high_freq_factor"]),
                    "rope_original_max_position":
                        float(rp["original_max_position_embeddings"])})
    return out, datasets


def hf_forward(model, cache, device, extra):
    """forward(input_ids) for decode_and_record: runs `model` on the new tokens with
    `cache` and returns the logits of the last position."""
    def forward(input_ids):
        out = model(input_ids=input_ids.to(device), past_key_values=cache, use_cache=True,
                    **extra)
        return out.logits[0, -1]
    return forward


def _version_tuple(v):
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _tokenize(tok, prompt, chat):
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, tokenize=True)
    else:
        ids = tok(prompt)["input_ids"]
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(i) for i in ids]


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Dump fadkv-bench traces from a Hugging Face "
                                             "causal LM (see datasets/DUMPING.md).")
    ap.add_argument("--model", required=True, help="model name on the Hub or local path")
    ap.add_argument("--prompts", required=True, help=".txt (one per line) or .jsonl (prompt)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--greedy", action="store_true", help="greedy decoding (the default)")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    ap.add_argument("--no-queries", action="store_true", help="do not record queries")
    ap.add_argument("--pre-rope-keys", action="store_true",
                    help="also store the keys before RoPE (k_norm or k_proj output) as "
                         "/layers/Lxx/keys_pre_rope")
    ap.add_argument("--chat-template", action="store_true",
                    help="wrap each prompt as a user turn with the tokenizer's chat template")
    ap.add_argument("--attn-base", choices=("sdpa", "eager"), default="sdpa",
                    help="attention the capture function wraps")
    ap.add_argument("--chunk-tokens", type=int, default=256, help="HDF5 chunk length")
    ap.add_argument("--resume", action="store_true", help="skip prompts already dumped")
    ap.add_argument("--revision", default=None, help="model revision (branch, tag, commit)")
    a = ap.parse_args(argv)
    if a.greedy and a.temperature is not None:
        ap.error("--greedy and --temperature are exclusive")
    if a.temperature is None and a.top_p != 1.0:
        ap.error("--top-p needs --temperature (decoding is greedy without it)")
    if a.max_new_tokens < 0:
        ap.error("--max-new-tokens must be >= 0")
    return a


def check_transformers(transformers):
    """Exit with a clear message on releases this dumper cannot drive: before 4.48 (and any
    release without AttentionInterface) there is no attention interface to register the
    capture function with. 4.48 - 4.55 get a warning (untested); >= 4.56 is the target."""
    v = _version_tuple(getattr(transformers, "__version__", "0.0"))
    if v < (4, 48) or not hasattr(transformers, "AttentionInterface"):
        raise SystemExit("dump_hf.py: transformers %s has no attention interface "
                         "(transformers.AttentionInterface), which the query capture "
                         "registers with; releases up to 4.47 are not supported. Install "
                         "transformers >= %d.%d (see datasets/DUMPING.md)"
                         % ((getattr(transformers, "__version__", "?"),) + MIN_TRANSFORMERS))
    if v < MIN_TRANSFORMERS:
        print("warning: transformers %s is older than %d.%d, the version this dumper targets; "
              "untested" % ((transformers.__version__,) + MIN_TRANSFORMERS), file=sys.stderr)


def main(argv=None, model=None, tokenizer=None):
    """Command-line entry point. `model` (and `tokenizer`), when given, are used instead of
    from_pretrained(--model) -- e.g. a model built with from_config by a test; --model is
    then only the model_id written to the traces. The model is switched to the capture
    attention (set_attn_implementation, or config._attn_implementation)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    prompts = read_prompts(args.prompts)
    sampler = Sampler(greedy=args.temperature is None, temperature=args.temperature or 1.0,
                      top_p=args.top_p, seed=args.seed)

    import torch
    try:
        import transformers
    except ImportError as e:
        raise SystemExit("dump_hf.py needs transformers >= %d.%d (%s)"
                         % (MIN_TRANSFORMERS + (e,)))
    check_transformers(transformers)
    from transformers import AttentionInterface

    capture = Capture(want_queries=not args.no_queries)
    # register() is global (every model sees it); item assignment on an interface instance
    # is local to that instance and not seen by the models.
    AttentionInterface.register(CAPTURE_NAME, make_capture_attention(capture, args.attn_base))
    try:  # without a registered mask function transformers would pass no causal mask
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_NAME,
                                              ALL_MASK_ATTENTION_FUNCTIONS[args.attn_base])
    except ImportError:  # releases without masking_utils build masks in the model code
        pass

    tdtype = getattr(torch, args.dtype)
    if tokenizer is None:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(args.model, revision=args.revision)
    tok = tokenizer
    if model is None:
        from transformers import AutoModelForCausalLM
        kw = {"attn_implementation": CAPTURE_NAME}
        if args.revision:
            kw["revision"] = args.revision
        kw["dtype" if _version_tuple(transformers.__version__) >= (4, 56)
           else "torch_dtype"] = tdtype
        model = AutoModelForCausalLM.from_pretrained(args.model, **kw)
    else:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(CAPTURE_NAME)
        else:
            model.config._attn_implementation = CAPTURE_NAME
        model = model.to(tdtype)
    model = model.to(args.device).eval()
    try:
        L, hq, hkv, d, theta, layer_attrs = model_shape(model.config)
        rope_root, rope_data = rope_attrs(model.config, model)
    except ValueError as e:
        raise SystemExit("dump_hf.py: %s: %s" % (args.model, e))
    softcap = getattr(_text_config(model.config), "attn_logit_softcapping", None)
    if softcap is not None and args.attn_base == "sdpa":
        raise SystemExit("dump_hf.py: %s: the model soft-caps its attention logits "
                         "(attn_logit_softcapping = %s), which sdpa ignores; use --attn-base "
                         "eager" % (args.model, softcap))
    handles = hook_pre_rope_keys(model, capture) if args.pre_rope_keys else []
    try:
        return _dump_prompts(args, prompts, sampler, model, tok, capture, transformers, torch,
                             (L, hq, hkv, d, theta, layer_attrs), (rope_root, rope_data))
    finally:
        for h in handles:  # the caller's model (main(model=...)) is left as it came
            h.remove()


def _dump_prompts(args, prompts, sampler, model, tok, capture, transformers, torch, shape,
                  rope):
    """The loop of main(): one trace per prompt."""
    L, hq, hkv, d, theta, layer_attrs = shape
    rope_root, rope_data = rope
    fwd_params = inspect.signature(model.forward).parameters
    extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd_params else {}

    eos = set()
    for e in (getattr(model.generation_config, "eos_token_id", None), tok.eos_token_id):
        if e is not None:
            eos.update(e if isinstance(e, (list, tuple)) else [e])

    os.makedirs(args.out, exist_ok=True)
    manifest_path = os.path.join(args.out, "manifest.jsonl")
    manifest = {}
    if args.resume and os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    e = json.loads(line)
                    manifest[e["file"]] = e

    from transformers import DynamicCache
    for i, prompt in enumerate(prompts):
        name = "trace-%05d.h5" % i
        path = os.path.join(args.out, name)
        psha = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        done = manifest.get(name)
        if args.resume and os.path.exists(path) and done and done["prompt_sha256"] == psha:
            print("%s: exists, skipped" % path)
            continue
        ids = _tokenize(tok, prompt, args.chat_template)
        try:
            cache = DynamicCache(config=model.config)
        except TypeError:
            cache = DynamicCache()
        forward = hf_forward(model, cache, args.device, extra)

        attrs = {
            "model_id": args.model, "num_layers": L, "num_q_heads": hq, "num_kv_heads": hkv,
            "head_dim": d, "keys_post_rope": 1, "source": "hf",
            "prompt_len": len(ids),
            "model_revision": args.revision or getattr(model.config, "_commit_hash", "") or "",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__, "dumper_version": DUMPER_VERSION,
            "generator": "dump_hf.py %s" % DUMPER_VERSION, "prompt": prompt,
            "prompt_sha256": psha,
            "chat_template": "yes" if args.chat_template else "no",
            "sampling": json.dumps(sampler.describe(), sort_keys=True),
            "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "attn_implementation": "%s(%s)" % (CAPTURE_NAME, args.attn_base),
            "device": args.device, "gqa_group": hq // hkv,
            "pre_rope_keys": "yes" if args.pre_rope_keys else "no",
        }
        if theta is not None:
            attrs["rope_theta"] = theta
        attrs.update(rope_root)
        if not sampler.greedy:
            attrs["seed"] = args.seed
        sampler.reset()
        try:
            with torch.inference_mode(), fkv_trace_writer.TraceWriter(
                    path, attrs, args.dtype, queries=not args.no_queries,
                    chunk_tokens=args.chunk_tokens, layer_attrs=layer_attrs,
                    pre_rope_keys=args.pre_rope_keys) as w:
                for dpath, (arr, dattrs) in rope_data.items():
                    w.add_dataset(dpath, arr, dattrs)
                gen, reason = decode_and_record(forward, cache, capture, w, ids,
                                                args.max_new_tokens, sampler, eos)
                w.set_attr("generated_text", tok.decode(gen, skip_special_tokens=False))
                w.set_attr("stop_reason", reason)
                w.set_attr("decode_len", w.T - len(ids))
                T = w.T
        except RuntimeError as e:  # a capture check failed; the writer removed its file
            raise SystemExit("dump_hf.py: %s: %s" % (path, e))
        del cache, forward  # free the KV cache before the next prompt
        manifest[name] = {"file": name, "prompt_index": i, "prompt_sha256":
                          attrs["prompt_sha256"], "tokens": T, "prompt_len": len(ids),
                          "stop": reason}
        tmp = manifest_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for e in sorted(manifest.values(), key=lambda e: e["file"]):
                f.write(json.dumps(e, sort_keys=True) + "\n")
        os.replace(tmp, manifest_path)
        print("%s: %d tokens (prefill %d, decode %d), stop %s" % (path, T, len(ids),
                                                                  T - len(ids), reason))
    return 0


if __name__ == "__main__":
    sys.exit(main())
