#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Convert a Lexico dictionary tensor into a fadkv-bench dictionary file (format v1).

usage: import_lexico_dict.py IN.pt OUT.h5 [--tensor-key KEY]

IN.pt holds Lexico's dictionary: one tensor of shape (2L, m, N) (what Lexico's
`Autoencoder.save_dictionary` writes with torch.save), or a dict containing one (its
training checkpoint, a state_dict with the key "D"). Slice 2l is the key dictionary of
layer l, slice 2l+1 the value dictionary, and column j of a slice is atom j.

OUT.h5 follows the dictionary format v1 of datasets/README.md: root attributes schema,
schema_version, head_dim (m), num_layers (L), atoms (N), provenance strings (method =
"lexico-import", source_file, source_sha256, tensor_key, source_dtype, source_shape, atom
norm range), and /layers/Lxx/keys, /layers/Lxx/values as [N, m] float32, atom-major (the
transpose of each slice). Atoms are written as they are (fp16/bf16 widened exactly to
float32); the fadkv-bench loader renormalises them to unit norm and reports the deviation.
The file is written under a temporary name and renamed into place.
"""
import argparse
import hashlib
import os
import sys


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_tensor(obj, key, path):
    """The (2L, m, N) tensor inside what torch.load returned, and the key it was found
    under ("" for a bare tensor)."""
    import torch
    if isinstance(obj, torch.Tensor):
        if key:
            raise SystemExit("%s: holds a bare tensor; --tensor-key %s does not apply"
                             % (path, key))
        return obj, ""
    if not isinstance(obj, dict):
        raise SystemExit("%s: expected a tensor or a dict of tensors, found %s"
                         % (path, type(obj).__name__))
    if key:
        cur = obj
        for part in key.split("/"):
            if not isinstance(cur, dict) or part not in cur:
                raise SystemExit("%s: no entry %r (keys: %s)"
                                 % (path, key, ", ".join(map(str, obj.keys()))))
            cur = cur[part]
        if not isinstance(cur, torch.Tensor):
            raise SystemExit("%s: entry %r is a %s, expected a tensor"
                             % (path, key, type(cur).__name__))
        return cur, key
    cands = [(str(k), v) for k, v in obj.items() if isinstance(v, torch.Tensor) and v.dim() == 3]
    if len(cands) != 1:
        raise SystemExit("%s: %s 3-D tensors in the dict (%s); choose one with --tensor-key"
                         % (path, "no" if not cands else "several",
                            ", ".join(k for k, _ in cands) or
                            ", ".join(map(str, obj.keys()))))
    return cands[0][1], cands[0][0]


def convert(tensor):
    """(2L, m, N) tensor -> float32 numpy array (2L, N, m), atom-major."""
    import torch
    if tensor.dim() != 3:
        raise ValueError("dictionary tensor has shape %s, expected (2L, m, N)"
                         % (tuple(tensor.shape),))
    twoL, m, n = tensor.shape
    if twoL < 2 or twoL % 2:
        raise ValueError("dictionary tensor has %d slices, expected an even number 2L "
                         "(keys and values of every layer)" % twoL)
    if m < 1 or n < 1:
        raise ValueError("dictionary tensor has an empty axis: %s" % (tuple(tensor.shape),))
    a = tensor.detach().to("cpu").to(torch.float32).transpose(1, 2).contiguous().numpy()
    return a


def write_dict(out, atoms, attrs):
    """Write a dictionary v1 file atomically. atoms: float32 (2L, N, m)."""
    import h5py
    import numpy as np
    twoL, n, m = atoms.shape
    bad = ~np.isfinite(atoms)
    if bad.any():
        s, j, c = np.argwhere(bad)[0]
        raise ValueError("non-finite value in %s dictionary of layer %d, atom %d, channel %d"
                         % ("key" if s % 2 == 0 else "value", s // 2, j, c))
    d = os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(out), os.getpid()))
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["schema"] = "fadkv-dict"
            f.attrs["schema_version"] = np.int64(1)
            f.attrs["head_dim"] = np.int64(m)
            f.attrs["num_layers"] = np.int64(twoL // 2)
            f.attrs["atoms"] = np.int64(n)
            for k, v in attrs.items():
                f.attrs[k] = str(v)
            for l in range(twoL // 2):
                g = f.create_group("/layers/L%02d" % l)
                for kind, s in (("keys", 2 * l), ("values", 2 * l + 1)):
                    g.create_dataset(kind, data=atoms[s], dtype="<f4", track_times=False)
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description="Convert Lexico's (2L, m, N) dictionary tensor "
                                             "into a fadkv-bench dictionary file (v1).")
    ap.add_argument("input", help="IN.pt (torch.save of the tensor, or of a dict holding it)")
    ap.add_argument("output", help="OUT.h5")
    ap.add_argument("--tensor-key", default="", help="key of the tensor in a dict (a/b for "
                                                      "nested dicts)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import numpy as np
        import torch
        import importlib.util
        if importlib.util.find_spec("h5py") is None:
            raise ImportError("No module named 'h5py'")
    except ImportError as e:
        raise SystemExit("import_lexico_dict.py needs torch, numpy and h5py (%s); on Debian "
                         "run it as PYENV_VERSION=system python3" % e)
    try:
        obj = torch.load(args.input, map_location="cpu")
    except Exception as e:
        raise SystemExit("%s: cannot load with torch.load: %s" % (args.input, e))
    tensor, key = find_tensor(obj, args.tensor_key, args.input)
    try:
        atoms = convert(tensor)
    except ValueError as e:
        raise SystemExit("%s: %s" % (args.input, e))
    norms = np.linalg.norm(atoms.astype(np.float64), axis=2)
    attrs = {
        "method": "lexico-import",
        "source_file": os.path.basename(args.input),
        "source_sha256": sha256_file(args.input),
        "tensor_key": key,
        "source_dtype": str(tensor.dtype).replace("torch.", ""),
        "source_shape": "(%d, %d, %d)" % tuple(tensor.shape),
        "source_layout": "lexico (2L, m, N): slice 2l keys, 2l+1 values, column j = atom j",
        "atom_norm_min": "%.9g" % norms.min(),
        "atom_norm_max": "%.9g" % norms.max(),
        "importer": "import_lexico_dict.py 1.0.0",
    }
    try:
        write_dict(args.output, atoms, attrs)
    except ValueError as e:
        raise SystemExit("%s: %s" % (args.input, e))
    twoL, n, m = atoms.shape
    print("%s: %d layers x {K, V}, N = %d atoms, head_dim %d, atom norms in [%.6g, %.6g] "
          "(from %s)" % (args.output, twoL // 2, n, m, norms.min(), norms.max(), args.input))
    return 0


if __name__ == "__main__":
    sys.exit(main())
