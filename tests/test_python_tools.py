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

class TinyLayer:
    """One cache layer as in transformers >= 4.56 (DynamicLayer: .keys, .values)."""

    def __init__(self):
        self.keys = None
        self.values = None


class TinyCache:
    """Mimics DynamicCache: update() appends along tokens and returns the whole layer."""

    def __init__(self, n_layers):
        self.layers = [TinyLayer() for _ in range(n_layers)]

    def update(self, k, v, layer_idx):
        lay = self.layers[layer_idx]
        if lay.keys is None:
            lay.keys, lay.values = k, v
        else:
            lay.keys = torch.cat([lay.keys, k], dim=-2)
            lay.values = torch.cat([lay.values, v], dim=-2)
        return lay.keys, lay.values

    def seq_length(self):
        return 0 if self.layers[0].keys is None else self.layers[0].keys.shape[-2]


def rope(x, pos, theta):
    """HF-style rotary embedding (rotate_half) of x [B, H, t, d] at positions pos [t]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def eager_gqa_attention(module, query, key, value, attention_mask, scaling, dropout=0.0,
                        **kwargs):
    """Reference attention with the transformers signature; keys/values before repeat_kv."""
    g = query.shape[1] // key.shape[1]
    k = key.float().repeat_interleave(g, dim=1)
    v = value.float().repeat_interleave(g, dim=1)
    s = query.float() @ k.transpose(-1, -2) * scaling
    if attention_mask is not None:
        s = s + attention_mask
    p = torch.softmax(s, dim=-1)
    return (p @ v).transpose(1, 2).contiguous(), p


def causal_mask(t, past):
    """Additive causal mask [1, 1, t, past + t] (None for a single new token)."""
    if t == 1:
        return None
    return torch.full((t, past + t), float("-inf")).triu(past + 1)[None, None]


class TinyAttention(torch.nn.Module):
    def __init__(self, layer_idx, hidden, hq, hkv, d, kv_dtype, theta, truth):
        super().__init__()
        self.layer_idx = layer_idx
        self.hq, self.hkv, self.d, self.theta = hq, hkv, d, theta
        self.kv_dtype = kv_dtype
        self.q_proj = torch.nn.Linear(hidden, hq * d, bias=False)
        self.k_proj = torch.nn.Linear(hidden, hkv * d, bias=False)
        self.v_proj = torch.nn.Linear(hidden, hkv * d, bias=False)
        self.o_proj = torch.nn.Linear(hq * d, hidden, bias=False)
        self.attn_fn = eager_gqa_attention
        self.truth = truth  # list of (layer, q, k, v) of every forward, for the test

    def forward(self, h, pos, cache, mask):
        B, t, _ = h.shape
        q = self.q_proj(h).view(B, t, self.hq, self.d).transpose(1, 2)
        k = self.k_proj(h).view(B, t, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(h).view(B, t, self.hkv, self.d).transpose(1, 2)
        q = rope(q, pos, self.theta).to(self.kv_dtype)
        k = rope(k, pos, self.theta).to(self.kv_dtype)
        v = v.to(self.kv_dtype)
        if self.truth is not None:
            self.truth.append((self.layer_idx, q[0].clone(), k[0].clone(), v[0].clone()))
        kf, vf = cache.update(k, v, self.layer_idx)
        out, _ = self.attn_fn(self, q, kf, vf, mask, scaling=self.d ** -0.5, dropout=0.0)
        return self.o_proj(out.reshape(B, t, self.hq * self.d).float())


class TinyLM(torch.nn.Module):
    def __init__(self, vocab=61, hidden=32, L=3, hq=4, hkv=2, d=16, kv_dtype=torch.float32,
                 theta=10000.0, truth=None):
        super().__init__()
        self.L, self.hq, self.hkv, self.d, self.theta = L, hq, hkv, d, theta
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.attn = torch.nn.ModuleList(
            [TinyAttention(i, hidden, hq, hkv, d, kv_dtype, theta, truth) for i in range(L)])
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def set_attention(self, fn):
        for a in self.attn:
            a.attn_fn = fn

    def forward(self, ids, cache, mask_fn=None):
        t = ids.shape[1]
        past = cache.seq_length()
        pos = torch.arange(past, past + t)
        mask = (mask_fn or causal_mask)(t, past)
        h = self.emb(ids)
        for a in self.attn:
            h = h + a(torch.nn.functional.layer_norm(h, h.shape[-1:]), pos, cache, mask)
        return self.head(torch.nn.functional.layer_norm(h, h.shape[-1:]))[0, -1]


def cache_free_greedy(model, prompt, steps):
    """Independent greedy decode: recompute the whole sequence at every step, no capture."""
    model.set_attention(eager_gqa_attention)
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
    for l, q, k, v in truth[: model.L * (1 + steps)]:
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

class FakeInterface(dict):
    """Stands in for transformers' AttentionInterface / ALL_MASK_ATTENTION_FUNCTIONS."""

    def register(self, key, fn):
        self[key] = fn


def install_fake_transformers():
    """A minimal module named `transformers` exposing what dump_hf.main() uses, with the
    >= 4.56 shapes: AttentionInterface.register, ALL_ATTENTION_FUNCTIONS,
    masking_utils.ALL_MASK_ATTENTION_FUNCTIONS (a model whose attention implementation has
    no registered mask function gets NO causal mask, as in transformers), DynamicCache with
    .layers[i].keys, from_pretrained(attn_implementation=..., dtype=...), logits_to_keep.
    It mirrors the API as documented; it is not transformers."""
    import types
    tf = types.ModuleType("transformers")
    tf.__version__ = "4.56.0"
    mu = types.ModuleType("transformers.modeling_utils")
    ms = types.ModuleType("transformers.masking_utils")
    attn = FakeInterface(sdpa=eager_gqa_attention)
    masks = FakeInterface(sdpa=causal_mask, eager=causal_mask)
    mu.ALL_ATTENTION_FUNCTIONS = attn
    ms.ALL_MASK_ATTENTION_FUNCTIONS = masks
    tf.AttentionInterface = attn
    loaded = []

    class Config:
        num_hidden_layers, num_attention_heads, num_key_value_heads = 3, 4, 2
        head_dim, hidden_size, rope_theta, _commit_hash = 16, 32, 10000.0, "0123abcd"

    class DynamicCache(TinyCache):
        def __init__(self, config=None):
            super().__init__(config.num_hidden_layers)

    class Model(TinyLM):
        def forward(self, input_ids=None, past_key_values=None, use_cache=True,
                    logits_to_keep=0):
            impl = self.config._attn_implementation
            self.set_attention(attn[impl])
            logits = TinyLM.forward(self, input_ids, past_key_values,
                                    masks.get(impl, lambda t, past: None))
            return types.SimpleNamespace(logits=logits[None, None, :])

    class AutoModelForCausalLM:
        @staticmethod
        def from_pretrained(name, attn_implementation="sdpa", dtype=torch.float32, **kw):
            torch.manual_seed(1234)
            m = Model(kv_dtype=dtype, truth=[])
            m.config = Config()
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
        for k in ("transformers", "transformers.modeling_utils", "transformers.masking_utils"):
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
    rope_layout (pre-RoPE codecs then refuse the trace) and keeps the config."""
    import types
    l3 = types.SimpleNamespace(rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 8192})
    a = dump_hf.rope_attrs(l3)
    check(a == {"rope_layout": "half", "rope_type": "llama3", "rope_factor": 32.0,
                "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
                "rope_original_max_position": 8192.0}, "rope_attrs: llama3 scaling (%r)" % a)
    new = types.SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    check(dump_hf.rope_attrs(new) == {"rope_layout": "half", "rope_type": "default"},
          "rope_attrs: rope_parameters of newer transformers, default type")
    for cfg in (types.SimpleNamespace(rope_scaling={"type": "yarn", "factor": 4.0}),
                types.SimpleNamespace(partial_rotary_factor=0.5)):
        a = dump_hf.rope_attrs(cfg)
        check("rope_layout" not in a and "rope_unsupported" in a,
              "rope_attrs: no rope_layout for %r" % a)


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


def main():
    check("transformers" not in sys.modules, "dump_hf imports without transformers")
    with tempfile.TemporaryDirectory() as tmp:
        dumps = os.path.join(tmp, "dumps")
        os.mkdir(dumps)
        traces = [test_dump(dumps, enc) for enc in ("bfloat16", "float16", "float32")]
        test_dump(dumps, "bfloat16", queries=False)  # (kept out of the sweep: no queries)
        test_sampling()
        test_rope_attrs()
        guards = os.path.join(tmp, "guards")
        os.mkdir(guards)
        test_writer_guards(guards)
        imports = os.path.join(tmp, "imports")
        os.mkdir(imports)
        test_import(imports)
        test_sweep(traces, os.path.join(imports, "lexico-0.h5"), tmp)
        fake = os.path.join(tmp, "fake")
        os.mkdir(fake)
        test_main(fake)
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
