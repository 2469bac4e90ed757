#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Makes the synthetic data of the default job (deterministic; skipped when present):
#   datasets/synth/eval/   2 evaluation sequences, Llama-3.2-3B head shape (24 query heads,
#                          8 KV heads, head_dim 128), 4 layers, 256 prefill + 512 decode
#   datasets/synth/calib/  2 calibration sequences of the same model (other sequence seeds)
#   datasets/synth/dict-n1024-s8.h5   dictionary trained on calib/ only (N = 1024, s = 8)
set -euo pipefail
bin=${1:-build/fadkv-bench}
cd "$(dirname "$0")/.."
out=datasets/synth
common=(--shape llama-3.2-3b --layers 4 --prefill 256 --decode 512 --sequences 2)
if [ ! -f "$out/dict-n1024-s8.h5" ]; then
    rm -rf "$out.tmp" && mkdir -p "$out.tmp/eval" "$out.tmp/calib"
    "$bin" synth --out "$out.tmp/eval" "${common[@]}" --first-seq 0 >/dev/null
    "$bin" synth --out "$out.tmp/calib" "${common[@]}" --first-seq 100 >/dev/null
    "$bin" train-dict --quiet --out "$out.tmp/dict-n1024-s8.h5" --atoms 1024 --sparsity 8 \
        --epochs 4 --jobs 2 --max-train 8192 "$out.tmp"/calib/*.h5
    rm -rf "$out" && mv "$out.tmp" "$out"
fi
