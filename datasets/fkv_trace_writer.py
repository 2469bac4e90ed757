# SPDX-License-Identifier: MIT
"""Streaming writer of fadkv-bench trace files (trace format v1, datasets/README.md).

Used by dump_hf.py and by tests/test_python_tools.py. Needs numpy and h5py; torch is
optional (tensors are accepted when it is installed, but it is never imported here).

A trace is written one step at a time: `append()` adds `t` new tokens to every layer
(keys and values `[H_kv, t, d]`, queries `[H_q, t, d]`). Appends are buffered in memory up
to `flush_tokens` tokens (default 64: `64 * L * (2 H_kv + H_q) * d * bytes`, 28 MB for
Qwen3-4B in bf16), then written with one resize + write per dataset to resizable datasets
chunked `[1, chunk_tokens, d]` along tokens, with HDF5's chunk cache off, so memory does not
grow with the sequence length. The file is written under a temporary name in the
target directory and renamed into place by `commit()`; `abort()` (or an exception inside a
`with` block) removes it, so a reader never sees a half-written trace.

Encodings (the `encoding` attribute of every keys/values/queries dataset):
  float32   IEEE single
  float16   IEEE half (h5py's float16)
  bfloat16  uint16 holding the upper 16 bits of the float32 pattern (lossless for bf16)
A bf16 torch tensor stored as "bfloat16" keeps its exact bits; a float32 input stored as
bfloat16 is rounded to nearest even.
"""
import os

import h5py
import numpy as np

SCHEMA = "fadkv-trace"
SCHEMA_VERSION = 1
ENCODINGS = ("float32", "float16", "bfloat16")
_STORE_DTYPE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}
_REQUIRED_INT = ("num_layers", "num_q_heads", "num_kv_heads", "head_dim", "keys_post_rope",
                 "prompt_len")
# Root attributes stored as float64 (the reader also accepts numbers written as strings).
_FLOAT = ("rope_theta", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
          "rope_original_max_position")


def layer_group(layer):
    """Name of the group of layer `layer`: L00 .. L99, then L100 ..."""
    return "/layers/L%02d" % layer


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_bits_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_storage(x, encoding):
    """Convert a torch tensor or numpy array to the numpy array stored for `encoding`.

    bf16 tensors keep their exact bits under "bfloat16"; a uint16 numpy array is taken as
    bf16 bits already. Raises ValueError on an unknown encoding."""
    if encoding not in ENCODINGS:
        raise ValueError("unknown encoding %r, expected one of %s" % (encoding, ENCODINGS))
    if _is_torch(x):
        import torch  # only reached when the caller passed a tensor
        x = x.detach().to("cpu")
        if encoding == "bfloat16":
            if x.dtype != torch.bfloat16:
                x = x.to(torch.float32).to(torch.bfloat16)
            return x.contiguous().view(torch.int16).numpy().view(np.uint16)
        if encoding == "float16":
            return x.to(torch.float16).contiguous().numpy()
        return x.to(torch.float32).contiguous().numpy()
    a = np.asarray(x)
    if encoding == "bfloat16":
        return a if a.dtype == np.uint16 else f32_to_bf16_bits(a)
    return np.ascontiguousarray(a, dtype=_STORE_DTYPE[encoding])


def _all_finite(stored, encoding):
    if encoding == "bfloat16":
        return bool(((stored & 0x7F80) != 0x7F80).all())
    return bool(np.isfinite(stored).all())


class TraceWriter:
    """Write one trace file step by step (see the module docstring).

    attrs must hold num_layers, num_q_heads, num_kv_heads, head_dim, keys_post_rope and
    prompt_len (integers), model_id and source (strings), rope_theta (float); every other
    attribute is stored as a string (provenance). Use as a context manager or call
    commit()/abort() explicitly."""

    def __init__(self, path, attrs, encoding, queries=True, ids=True, chunk_tokens=256,
                 layer_attrs=None, flush_tokens=64, pre_rope_keys=False):
        if encoding not in ENCODINGS:
            raise ValueError("unknown encoding %r, expected one of %s" % (encoding, ENCODINGS))
        for k in _REQUIRED_INT:
            if k not in attrs:
                raise ValueError("trace attribute %r is required" % k)
        self.path = os.fspath(path)
        self.encoding = encoding
        self.queries = bool(queries)
        self.ids = bool(ids)
        self.pre_rope_keys = bool(pre_rope_keys)  # /layers/Lxx/keys_pre_rope [H_kv, T, d]
        self.L = int(attrs["num_layers"])
        self.hq = int(attrs["num_q_heads"])
        self.hkv = int(attrs["num_kv_heads"])
        self.d = int(attrs["head_dim"])
        self.prompt_len = int(attrs["prompt_len"])
        if self.L < 1 or self.hq < 1 or self.hkv < 1 or not 1 <= self.d <= 4096:
            raise ValueError("bad shape attributes L=%d H_q=%d H_kv=%d d=%d"
                             % (self.L, self.hq, self.hkv, self.d))
        if self.hq % self.hkv:
            raise ValueError("num_q_heads %d is not a multiple of num_kv_heads %d"
                             % (self.hq, self.hkv))
        self.T = 0            # tokens written so far
        self.n_prefill = 0    # phase-0 tokens written so far
        self.decode_seen = False
        d = os.path.dirname(os.path.abspath(self.path))
        self.tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(self.path), os.getpid()))
        # Appends are buffered (flush_tokens) and written straight through. With HDF5's
        # chunk cache off, memory stays flat whatever the trace length (measured on a
        # 3,064-token Qwen3-4B-shaped bf16 trace: 2-3.5 ms per decode step, flat RSS; a
        # 5 MiB chunk cache per dataset was slower and reached 863 MB RSS).
        self.f = h5py.File(self.tmp, "w", rdcc_nbytes=0)
        self.flush_tokens = max(1, int(flush_tokens))
        self._pending_tokens = 0
        self._pending = {}   # dataset key -> list of arrays waiting to be written
        self._ds = {}        # dataset key -> open h5py dataset
        try:
            self._create(attrs, chunk_tokens, layer_attrs or {})
        except BaseException:
            self.abort()
            raise

    def _create(self, attrs, chunk_tokens, layer_attrs):
        f = self.f
        f.attrs["schema"] = SCHEMA
        f.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
        for k, v in attrs.items():
            if k in _REQUIRED_INT:
                f.attrs[k] = np.int64(int(v))
            elif k in _FLOAT:
                f.attrs[k] = np.float64(v)
            else:
                f.attrs[k] = str(v)
        ct = max(1, int(chunk_tokens))
        tok = f.create_group("tokens")
        names = [("positions", "<i4"), ("phase", "u1")] + ([("ids", "<i4")] if self.ids else [])
        for name, dt in names:
            self._ds[("tokens", name)] = tok.create_dataset(
                name, (0,), maxshape=(None,), dtype=dt, chunks=(4096,), track_times=False)
        dt = _STORE_DTYPE[self.encoding]
        for l in range(self.L):
            g = f.create_group(layer_group(l))
            for k, v in layer_attrs.get(l, {}).items():
                g.attrs[k] = str(v)
            names = [("keys", self.hkv), ("values", self.hkv)]
            if self.pre_rope_keys:
                names.append(("keys_pre_rope", self.hkv))
            if self.queries:
                names.append(("queries", self.hq))
            for name, h in names:
                ds = g.create_dataset(name, (h, 0, self.d), maxshape=(h, None, self.d), dtype=dt,
                                      chunks=(1, ct, self.d), track_times=False)
                ds.attrs["encoding"] = self.encoding
                self._ds[(l, name)] = ds
            if self.queries:
                self._ds[(l, "query_token_idx")] = g.create_dataset(
                    "query_token_idx", (0,), maxshape=(None,), dtype="<i4", chunks=(4096,),
                    track_times=False)
        self._pending = {k: [] for k in self._ds}

    def set_attr(self, name, value):
        """Set (or replace) a root provenance attribute, stored as a string."""
        if name in _REQUIRED_INT or name in ("schema", "schema_version"):
            raise ValueError("attribute %r is fixed at creation" % name)
        if name in _FLOAT:
            self.f.attrs[name] = np.float64(value)
        else:
            self.f.attrs[name] = str(value)

    def set_layer_attr(self, layer, name, value):
        """Set (or replace) an attribute of /layers/Lxx, stored as a string."""
        if not 0 <= int(layer) < self.L:
            raise ValueError("layer %d out of range [0, %d)" % (layer, self.L))
        self.f[layer_group(int(layer))].attrs[name] = str(value)

    def add_dataset(self, path, data, attrs=None):
        """Write a small extra dataset (e.g. /rope/inv_freq) in one go, with string
        attributes. The C reader ignores datasets it does not know."""
        if path.startswith("/tokens") or path.startswith("/layers"):
            raise ValueError("%s: extra datasets may not live under /tokens or /layers" % path)
        ds = self.f.create_dataset(path, data=np.asarray(data), track_times=False)
        for k, v in (attrs or {}).items():
            ds.attrs[k] = str(v)
        return ds

    @staticmethod
    def _grow(ds, axis, n, data):
        old = ds.shape[axis]
        shape = list(ds.shape)
        shape[axis] = old + n
        ds.resize(tuple(shape))
        if axis == 0:
            ds[old:old + n] = data
        else:
            ds[:, old:old + n, :] = data

    def append(self, positions, phase, keys, values, queries=None, ids=None,
               keys_pre_rope=None):
        """Append t tokens: positions (t ints), phase (0 prefill / 1 decode, scalar or t
        values), keys[l] and values[l] of shape [H_kv, t, d] for every layer l, queries[l] of
        [H_q, t, d] (required iff the writer records queries), ids (t ints, required iff
        the writer records ids). Arrays may be numpy or torch; a leading batch axis of 1
        is accepted."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        t = positions.shape[0]
        if t < 1:
            raise ValueError("append: no tokens")
        ph = np.broadcast_to(np.asarray(phase, dtype=np.int64), (t,))
        if ((ph != 0) & (ph != 1)).any():
            raise ValueError("append: phase must be 0 or 1")
        if (positions < 0).any() or (positions > np.iinfo(np.int32).max).any():
            raise ValueError("append: positions must be in [0, 2^31)")
        if (self.decode_seen and (ph == 0).any()) or (np.diff(ph) < 0).any():
            raise ValueError("append: prefill tokens must come before every decode token")
        if len(keys) != self.L or len(values) != self.L:
            raise ValueError("append: expected %d layers of keys and values, got %d and %d"
                             % (self.L, len(keys), len(values)))
        if self.queries and (queries is None or len(queries) != self.L):
            raise ValueError("append: expected %d layers of queries" % self.L)
        if self.pre_rope_keys and (keys_pre_rope is None or len(keys_pre_rope) != self.L):
            raise ValueError("append: expected %d layers of pre-RoPE keys" % self.L)
        if self.ids and ids is None:
            raise ValueError("append: token ids are required (writer created with ids=True)")
        blocks = []
        for l in range(self.L):
            parts = [("keys", keys[l], self.hkv), ("values", values[l], self.hkv)]
            if self.pre_rope_keys:
                parts.append(("keys_pre_rope", keys_pre_rope[l], self.hkv))
            if self.queries:
                parts.append(("queries", queries[l], self.hq))
            for name, x, h in parts:
                a = to_storage(x, self.encoding)
                if a.ndim == 4 and a.shape[0] == 1:
                    a = a[0]
                if a.shape != (h, t, self.d):
                    raise ValueError("append: layer %d %s has shape %s, expected %s"
                                     % (l, name, a.shape, (h, t, self.d)))
                if not _all_finite(a, self.encoding):
                    raise ValueError("append: layer %d %s holds a NaN or Inf, or a value "
                                     "beyond the %s range (tokens %d..%d)"
                                     % (l, name, self.encoding, self.T, self.T + t - 1))
                blocks.append((l, name, a))
        if self.ids:
            id_arr = np.asarray(ids.detach().cpu() if _is_torch(ids) else ids,
                                dtype=np.int64).reshape(-1)
            if id_arr.shape[0] != t:
                raise ValueError("append: %d ids for %d tokens" % (id_arr.shape[0], t))
        # Everything validated: buffer, and write once flush_tokens tokens are pending.
        pend = self._pending
        pend[("tokens", "positions")].append(positions.astype(np.int32))
        pend[("tokens", "phase")].append(ph.astype(np.uint8))
        if self.ids:
            pend[("tokens", "ids")].append(id_arr.astype(np.int32))
        for l, name, a in blocks:
            pend[(l, name)].append(a)
        if self.queries:
            idx = np.arange(self.T, self.T + t, dtype=np.int32)
            for l in range(self.L):
                pend[(l, "query_token_idx")].append(idx)
        self._pending_tokens += t
        self.T += t
        self.n_prefill += int((ph == 0).sum())
        if ph.max() == 1:
            self.decode_seen = True
        if self._pending_tokens >= self.flush_tokens:
            self.flush()

    def flush(self):
        """Write the buffered tokens to the file (one resize + write per dataset)."""
        if not self._pending_tokens:
            return
        for key, parts in self._pending.items():
            if not parts:
                continue
            ds = self._ds[key]
            axis = 1 if ds.ndim == 3 else 0
            data = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
            self._grow(ds, axis, data.shape[axis], data)
            parts.clear()
        self._pending_tokens = 0

    def commit(self):
        """Check the prompt length, close the file and rename it into place. Returns the
        final path."""
        if self.f is None:
            raise ValueError("trace writer already closed")
        if self.T < 1:
            self.abort()
            raise ValueError("%s: no token was written" % self.path)
        if self.n_prefill != self.prompt_len:
            self.abort()
            raise ValueError("%s: prompt_len = %d but %d prefill tokens were written"
                             % (self.path, self.prompt_len, self.n_prefill))
        try:
            self.flush()
        except BaseException:
            self.abort()
            raise
        self.f.close()
        self.f = None
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self):
        """Discard the file being written."""
        if self.f is not None:
            try:
                self.f.close()
            except Exception:  # pragma: no cover - best effort on an error path
                pass
            self.f = None
        if os.path.exists(self.tmp):
            os.remove(self.tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False
