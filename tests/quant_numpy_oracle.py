#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""NumPy oracle of the quantisation family end to end: `fadkv-bench --config` against the
state machines of the spec, replayed here over the same traces.

Written from families.md 1.1 (KIVI: keys per channel in blocks of R, values per token behind
a window of R) and 1.2 (Hugging Face's QuantizedLayer.update: the prefill quantised whole,
the whole cache quantised again at every flush; and the sliding-window baseline), with the
quantiser of quant/fk_quant_group.h's contract in NumPy: fp16 min and scale (numpy.float16,
round half to even), codes from the stored values in float32, x_hat = q scale + min.
For the embedded fortune traces (head_dim 64, 2 KV heads, 4 layers) and several settings of
kivi and quant it recomputes what the cell tables report and compares:
  - rel_err_k, rel_err_v: mean over layers of the mean over traces of each stream's mean
    relative error of its vectors as stored right after their event (relative 1e-6),
  - rel_err_final_mean: the same with the rows as they are at the end (re-quantised rows
    included), mean over every stream (relative 1e-6),
  - bytes_tok_head (end of trace) and bytes_tok_head_avg (mean over decode steps of
    B(t) / (t + 1)), with the byte formulas of the codecs' headers (relative 1e-8: the
    tables hold 9 significant digits),
  - vectors: the compressed vectors of every stream (exact).

usage: quant_numpy_oracle.py FADKV_BENCH_EXE
Exits 77 (skip) when numpy or h5py are missing.
"""
import csv
import glob
import os
import subprocess
import sys
import tempfile

SKIP = 77

try:
    import numpy as np
    import h5py
except ImportError as e:  # pragma: no cover
    print(f"skip: {e} (run with PYENV_VERSION=system python3)")
    sys.exit(SKIP)

SRC = os.environ.get("FK_SRCDIR", os.path.join(os.path.dirname(__file__), ".."))
TRACES = sorted(glob.glob(os.path.join(SRC, "datasets/embedded/fortune-byte-4L-*.h5")))

# (label, codec, options): the sweep's [[codec]] blocks
CASES = [
    ("kivi-2", "kivi", {"bits": 2, "group": 16, "residual": 32}),
    ("kivi-4", "kivi", {"bits": 4, "group": 32, "residual": 32}),
    ("quant-hf", "quant", {"bits": 4, "group": 16, "residual": 32}),
    ("quant-hf-ch", "quant", {"bits": 2, "group": 32, "residual": 32, "axis_k": "channel",
                              "axis_v": "channel"}),
    ("quant-win", "quant", {"bits": 4, "group": 32, "residual": 32, "mode": "window"}),
]


def fp16(a):
    """The fp16 value, saturated to +-65504, as float32."""
    return np.clip(a, -65504, 65504).astype(np.float16).astype(np.float32)


def quant_last(x, bits):
    """Groups along the last axis of float32 x, dequantised."""
    top = 2 ** bits - 1
    mn = x.min(axis=-1, keepdims=True)
    mx = x.max(axis=-1, keepdims=True)
    lo = fp16(mn)
    step = fp16(((mx.astype(np.float64) - mn.astype(np.float64)) / top).astype(np.float32))
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(step > 0, (x - lo) / step, np.float32(0))
    q = np.rint(np.clip(v, np.float32(0), np.float32(top)))
    return (q * step + lo).astype(np.float32)


def per_token(x, g, bits):
    """[..., D] in groups of g channels."""
    s = x.shape
    return quant_last(x.reshape(s[:-1] + (s[-1] // g, g)), bits).reshape(s)


def per_channel_blocks(x, g, bits):
    """KIVI keys [H, n, D]: per channel, groups of g consecutive tokens (n % g == 0)."""
    h, n, d = x.shape
    y = x.reshape(h, n // g, g, d).transpose(0, 1, 3, 2)
    return quant_last(y, bits).transpose(0, 1, 3, 2).reshape(h, n, d)


def flat_channel(x, g, bits):
    """quanto axis -1 on [H, n, D]: per channel, groups of g rows of the flattening h n + t,
    the last one shorter."""
    h, n, d = x.shape
    flat = x.reshape(h * n, d).T.copy()  # [D][H n]
    out = np.empty_like(flat)
    for r0 in range(0, h * n, g):
        out[:, r0:r0 + g] = quant_last(flat[:, r0:r0 + g], bits)
    return out.T.reshape(h, n, d)


def rel_errors(x, y):
    """Per-vector relative errors of y against x ([H, n, D]); zero vectors are NaN."""
    x = x.astype(np.float64)
    e = ((x - y.astype(np.float64)) ** 2).sum(axis=-1)
    xx = (x ** 2).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(xx > 1e-30, np.sqrt(e / xx), np.nan)


class Stream:
    """One (trace, layer, kind) stream: the codec's rule, step by step."""

    def __init__(self, rule, x, P, o):
        self.rule, self.x, self.P = rule, x, P  # rule: kivi_k, window, hf
        self.H, self.T, self.D = x.shape
        self.bits, self.G, self.R = o["bits"], o["group"], o["residual"]
        self.channel = rule == "hf" and o["axis"] == "channel"
        self.deq = np.zeros_like(x)
        self.n = 0  # compressed tokens
        self.commit = []  # float32 errors of the vectors, right after their event
        self.tok_sum, self.steps = 0.0, 0

    def hand_over(self, end):
        """Tokens n .. end-1 are handed over (hf: the whole cache is quantised again)."""
        x, g, b = self.x, self.G, self.bits
        if self.rule == "kivi_k":
            self.deq[:, self.n:end] = per_channel_blocks(x[:, self.n:end], g, b)
        elif self.rule == "window":
            self.deq[:, self.n:end] = per_token(x[:, self.n:end], g, b)
        else:
            cache = np.concatenate([self.deq[:, :self.n], x[:, self.n:end]], axis=1)
            self.deq[:, :end] = (flat_channel if self.channel else per_token)(cache, g, b)
        err = rel_errors(x[:, self.n:end], self.deq[:, self.n:end])
        self.commit.extend(e for e in err.T.ravel().astype(np.float32) if not np.isnan(e))
        self.n = end

    def prefill(self):
        P, R = self.P, self.R
        end = {"kivi_k": P // R * R, "window": max(P - R, 0), "hf": P}[self.rule]
        if end > 0:
            self.hand_over(end)

    def after_attention(self, t):
        held = t + 1 - self.n  # exact tokens n .. t
        if self.rule == "kivi_k" and held == self.R:
            self.hand_over(t + 1)
        elif self.rule == "window" and held > self.R:
            self.hand_over(self.n + 1)
        elif self.rule == "hf" and held >= self.R:
            self.hand_over(t + 1)
        self.tok_sum += self.bytes(t) / (t + 1)
        self.steps += 1

    def codes(self):
        rows = self.n * self.H
        if self.channel:
            return rows * self.D * self.bits / 8 + 4 * self.D * -(-rows // self.G)
        return rows * (self.D * self.bits / 8 + 4 * self.D / self.G)

    def bytes(self, t):
        return self.codes() + (t + 1 - self.n) * self.H * self.D * 2

    def final_err(self):
        e = rel_errors(self.x[:, :self.n], self.deq[:, :self.n])
        return np.nansum(e) / len(self.commit) if self.commit else np.nan


def rules(codec, o):
    if codec == "kivi":
        return [("kivi_k", {}), ("window", {})]
    if o.get("mode", "hf") == "window":
        return [("window", {}), ("window", {})]
    return [("hf", {"axis": o.get("axis_k", "token")}), ("hf", {"axis": o.get("axis_v", "token")})]


def oracle(codec, o):
    """The headline values of one cell over TRACES."""
    kind_err = [[], []]  # per layer: mean over traces
    fin, vectors = [], 0
    total, tok_heads, avg_sum, avg_heads = 0.0, 0.0, 0.0, 0.0
    per_layer = {}
    for path in TRACES:
        with h5py.File(path, "r") as f:
            P = int(f.attrs["prompt_len"])
            for lname in sorted(f["layers"].keys()):
                for k, (rule, extra) in enumerate(rules(codec, o)):
                    x = f["layers"][lname]["keys" if k == 0 else "values"][...].astype(np.float32)
                    s = Stream(rule, x, P, {**o, **extra})
                    s.prefill()
                    for t in range(P, s.T):
                        s.after_attention(t)
                    vectors += len(s.commit)
                    per_layer.setdefault((lname, k), []).append(
                        np.mean(s.commit) if s.commit else np.nan)
                    fin.append(s.final_err())
                    total += s.codes() + (s.T - s.n) * s.H * s.D * 2
                    if k == 0:
                        tok_heads += s.T * s.H
                    avg_sum += s.tok_sum / s.steps
                    avg_heads += s.H / 2
    for (lname, k), vals in sorted(per_layer.items()):
        vals = [v for v in vals if not np.isnan(v)]
        if vals:
            kind_err[k].append(np.mean(vals))
    fin = [v for v in fin if not np.isnan(v)]
    return {"rel_err_k": np.mean(kind_err[0]), "rel_err_v": np.mean(kind_err[1]),
            "rel_err_final_mean": np.mean(fin), "bytes_tok_head": total / tok_heads,
            "bytes_tok_head_avg": avg_sum / avg_heads, "vectors": vectors}


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    exe = os.path.abspath(sys.argv[1])
    if len(TRACES) < 2:
        print(f"FAIL: no fortune traces under {SRC}/datasets/embedded")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "oracle.toml")
        with open(cfg, "w") as f:
            f.write('[sweep]\nname = "quant-oracle"\noutput = "%s"\njobs = 2\n'
                    'attention = false\n\n[[dataset]]\nname = "fortune"\ntraces = [%s]\n'
                    % (os.path.join(tmp, "out"), ", ".join('"%s"' % t for t in TRACES)))
            for _, codec, o in CASES:
                f.write('\n[[codec]]\nname = "%s"\n' % codec)
                for key, v in o.items():
                    f.write('%s = %s\n' % (key, '"%s"' % v if isinstance(v, str) else v))
        run = subprocess.run([exe, "--config", cfg], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            print("FAIL: fadkv-bench exited %d" % run.returncode)
            return 1
        with open(os.path.join(tmp, "out", "cells.csv")) as f:
            cells = list(csv.DictReader(f))
    bad = 0
    for (label, codec, o), cell in zip(CASES, cells):
        assert cell["codec"] == codec and cell["status"] == "ok", cell
        want = oracle(codec, o)
        for key, w in want.items():
            got = float(cell[key])
            # cells.csv holds 9 significant digits
            tol = 0 if key == "vectors" else 1e-8 if key.startswith("bytes") else 1e-6
            ok = abs(got - w) <= tol * abs(w)
            bad += not ok
            print("%-12s %-19s C %.10g  oracle %.10g  %s" % (label, key, got, w,
                                                             "ok" if ok else "DIFFERS"))
    print("FAIL: %d values differ" % bad if bad else "all values agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
