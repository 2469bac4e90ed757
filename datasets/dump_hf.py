#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Dump fadkv-bench traces (trace format v1, datasets/README.md) from a Hugging Face causal LM.

usage:
  dump_hf.py --model NAME_OR_PATH --prompts FILE --out DIR [--max-new-tokens N]
             [--greedy | --temperature T --top-p P --seed S]
             [--dtype bfloat16|float16|float32] [--device cpu|cuda] [--no-queries]
             [--chat-template] [--attn-base sdpa|eager] [--chunk-tokens N] [--resume]

FILE is a .txt file (one prompt per line; blank lines skipped) or a .jsonl file (one JSON
object per line with a "prompt" field). One trace per prompt is written to
DIR/trace-NNNNN.h5 (under a temporary name, renamed when complete), and DIR/manifest.jsonl
lists them.

Every prompt is decoded with batch size 1: one prefill forward over the prompt, then one
forward per generated token (greedy, or temperature + top-p sampling with a seeded
generator). After every forward the dumper records, for every layer:
  * keys and values of the new tokens, read from the cache (`DynamicCache.layers[i].keys`
    / `.values`, transformers >= 4.56), i.e. AFTER RoPE, exactly what the cache holds;
    they are checked bit for bit against the key/value tensors the attention function
    received;
  * the post-RoPE queries of the new tokens, captured by a custom attention function
    registered through transformers' AttentionInterface (it records the query and calls
    the stock "sdpa" or the model's "eager" attention), selected with
    attn_implementation="fadkv_capture".
Tensors are stored losslessly in the model dtype (bf16 as raw uint16 bits, encoding
"bfloat16"), appended step by step to chunked resizable datasets, so memory does not grow
with the trace beyond the model's own KV cache.

transformers is imported lazily (in main()), so the capture function, the decode loop and
the writer can be tested without it (tests/test_python_tools.py). Targets transformers
>= 4.56 (cache layers API, AttentionInterface, AttentionMaskInterface); see DUMPING.md.
"""
import argparse
import hashlib
import inspect
import json
import os
import sys

DUMPER_VERSION = "1.0.0"
CAPTURE_NAME = "fadkv_capture"
MIN_TRANSFORMERS = (4, 56)

sys.dont_write_bytecode = True  # no __pycache__ next to the sources
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fkv_trace_writer  # noqa: E402  (numpy + h5py only)


class Capture:
    """What the attention function saw during one forward pass, by layer index.

    queries[l] is the query tensor [B, H_q, t, d] (post-RoPE) of layer l; keys[l] and
    values[l] are the key/value tensors it received (the cache contents after the update,
    before repeat_kv), kept only as references for the consistency check."""

    def __init__(self, want_queries=True):
        self.want_queries = bool(want_queries)
        self.queries = {}
        self.keys = {}
        self.values = {}
        self.calls = 0  # attention calls since construction (all forwards)

    def reset(self):
        self.queries.clear()
        self.keys.clear()
        self.values.clear()

    def record(self, module, query, key, value):
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise RuntimeError("attention module %s has no layer_idx; cannot attribute the "
                               "captured query to a layer" % type(module).__name__)
        layer = int(layer)
        if layer in self.keys:
            raise RuntimeError("layer %d: attention called twice in one forward (shared or "
                               "cross-attention layers are not supported)" % layer)
        if self.want_queries:
            self.queries[layer] = query.detach()
        self.keys[layer] = key.detach()
        self.values[layer] = value.detach()
        self.calls += 1


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
        capture.record(module, query, key, value)
        key_t = type(module)
        fn = resolved.get(key_t)
        if fn is None:
            fn = resolved[key_t] = resolve_base_attention(base, module)
        return fn(module, query, key, value, attention_mask, **kwargs)

    return fadkv_capture_attention


def cache_layer_kv(cache, layer):
    """Key and value tensors [B, H_kv, T_layer, d] held by the cache for `layer` (None if
    the layer holds nothing yet). transformers >= 4.56: cache.layers[i].keys/.values;
    older releases: cache.key_cache[i] / cache.value_cache[i]."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        if layer >= len(layers):
            return None, None
        return getattr(layers[layer], "keys", None), getattr(layers[layer], "values", None)
    if hasattr(cache, "key_cache"):
        if layer >= len(cache.key_cache):
            return None, None
        return cache.key_cache[layer], cache.value_cache[layer]
    raise RuntimeError("unknown cache type %s: expected .layers (transformers >= 4.56) or "
                       ".key_cache" % type(cache).__name__)


def new_kv(cache, capture, layer, t):
    """Keys and values [H_kv, t, d] of the t tokens of the last forward in `layer`, read
    from the cache and checked against what the attention function received. Falls back to
    the attention function's tensors when the cache keeps fewer than t tokens (a sliding
    window layer after a long prefill)."""
    import torch  # the caller has torch (tensors come from a torch model)
    ck, cv = cache_layer_kv(cache, layer)
    ak, av = capture.keys.get(layer), capture.values.get(layer)
    if ck is not None and cv is not None and ck.shape[-2] >= t:
        k, v = ck[0, :, -t:, :], cv[0, :, -t:, :]
        if ak is not None and ak.dim() == 4 and ak.shape[1] == ck.shape[1] and \
                ak.shape[-2] >= t:
            if not (torch.equal(ak[0, :, -t:, :], k) and torch.equal(av[0, :, -t:, :], v)):
                raise RuntimeError("layer %d: the cache and the attention function disagree "
                                   "on the newest keys/values (quantised or offloaded "
                                   "cache?)" % layer)
        return k, v
    if ak is not None and ak.dim() == 4 and ak.shape[-2] >= t:
        return ak[0, :, -t:, :], av[0, :, -t:, :]
    raise RuntimeError("layer %d: neither the cache nor the attention call holds the %d new "
                       "tokens" % (layer, t))


def record_step(writer, cache, capture, positions, phase, ids):
    """Append the tokens of the last forward (positions, phase 0/1, ids) to the trace."""
    t = len(positions)
    keys, values, queries = [], [], []
    for layer in range(writer.L):
        k, v = new_kv(cache, capture, layer, t)
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
    writer.append(positions, phase, keys, values, queries if writer.queries else None, ids)


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
    stops decoding without being fed. Returns (generated ids, stop reason)."""
    import torch
    P = len(prompt_ids)
    if P < 1:
        raise ValueError("empty prompt (no token)")
    capture.reset()
    logits = forward(torch.tensor([list(prompt_ids)], dtype=torch.long))
    record_step(writer, cache, capture, list(range(P)), 0, list(prompt_ids))
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


def model_shape(config):
    """(L, H_q, H_kv, d, rope_theta, layer attrs) from a transformers config."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    L = int(cfg.num_hidden_layers)
    hq = int(cfg.num_attention_heads)
    hkv = int(getattr(cfg, "num_key_value_heads", None) or hq)
    d = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        rp = getattr(cfg, "rope_parameters", None) or {}
        if isinstance(rp, dict):
            theta = rp.get("rope_theta")
    layer_attrs = {}
    types = getattr(cfg, "layer_types", None)
    for l in range(L):
        a = {"layer_idx": l}
        if types and l < len(types):
            a["attention_type"] = types[l]
            if "sliding" in str(types[l]) and getattr(cfg, "sliding_window", None):
                a["sliding_window"] = cfg.sliding_window
        layer_attrs[l] = a
    return L, hq, hkv, d, float(theta) if theta is not None else 0.0, layer_attrs


def rope_attrs(config):
    """The trace format's RoPE attributes (datasets/README.md) from a transformers config.

    Hugging Face's Llama-family attention rotates with rotate_half: pairs (i, i + d/2), so
    rope_layout = "half". rope_type comes from rope_scaling (rope_parameters in newer
    transformers): "default" or "llama3" with its four numbers. Any other scaling (linear,
    dynamic, yarn, ...) or a partial rotary dimension cannot be described: then no
    rope_layout is written (pre-RoPE codecs refuse the trace) and the raw config is kept in
    rope_unsupported for provenance."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    rp = getattr(cfg, "rope_scaling", None) or getattr(cfg, "rope_parameters", None) or {}
    if not isinstance(rp, dict):
        rp = {}
    rtype = rp.get("rope_type", rp.get("type")) or "default"
    partial = float(getattr(cfg, "partial_rotary_factor", 1.0) or 1.0)
    if rtype not in ("default", "llama3") or partial != 1.0:
        return {"rope_unsupported": json.dumps({"rope_scaling": rp,
                                                 "partial_rotary_factor": partial},
                                                sort_keys=True, default=str)}
    out = {"rope_layout": "half", "rope_type": rtype}
    if rtype == "llama3":
        out.update({"rope_factor": float(rp["factor"]),
                    "rope_low_freq_factor": float(rp["low_freq_factor"]),
                    "rope_high_freq_factor": float(rp["high_freq_factor"]),
                    "rope_original_max_position":
                        float(rp["original_max_position_embeddings"])})
    return out


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


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    prompts = read_prompts(args.prompts)
    sampler = Sampler(greedy=args.temperature is None, temperature=args.temperature or 1.0,
                      top_p=args.top_p, seed=args.seed)

    import torch
    try:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, AttentionInterface
    except ImportError as e:
        raise SystemExit("dump_hf.py needs transformers >= %d.%d (%s)"
                         % (MIN_TRANSFORMERS + (e,)))
    if _version_tuple(transformers.__version__) < MIN_TRANSFORMERS:
        print("warning: transformers %s is older than %d.%d, the version this dumper targets"
              % ((transformers.__version__,) + MIN_TRANSFORMERS), file=sys.stderr)

    capture = Capture(want_queries=not args.no_queries)
    AttentionInterface.register(CAPTURE_NAME, make_capture_attention(capture, args.attn_base))
    try:  # without a registered mask function transformers would pass no causal mask
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_NAME,
                                              ALL_MASK_ATTENTION_FUNCTIONS[args.attn_base])
    except ImportError:  # releases without masking_utils build masks in the model code
        pass

    tdtype = getattr(torch, args.dtype)
    kw = {"attn_implementation": CAPTURE_NAME}
    if args.revision:
        kw["revision"] = args.revision
    kw["dtype" if _version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"] = tdtype
    tok = AutoTokenizer.from_pretrained(args.model, revision=args.revision)
    model = AutoModelForCausalLM.from_pretrained(args.model, **kw).to(args.device).eval()
    L, hq, hkv, d, theta, layer_attrs = model_shape(model.config)
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
            "head_dim": d, "keys_post_rope": 1, "rope_theta": theta, "source": "hf",
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
        }
        attrs.update(rope_attrs(model.config))
        if not sampler.greedy:
            attrs["seed"] = args.seed
        sampler.reset()
        with torch.inference_mode(), fkv_trace_writer.TraceWriter(
                path, attrs, args.dtype, queries=not args.no_queries,
                chunk_tokens=args.chunk_tokens, layer_attrs=layer_attrs) as w:
            gen, reason = decode_and_record(forward, cache, capture, w, ids,
                                            args.max_new_tokens, sampler, eos)
            w.set_attr("generated_text", tok.decode(gen, skip_special_tokens=False))
            w.set_attr("stop_reason", reason)
            w.set_attr("decode_len", w.T - len(ids))
            T = w.T
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
