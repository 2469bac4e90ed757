#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Synthetic data of configs/realism.toml at the shape of the real fortune-hd128 decodes
# (datasets/HD128.md: 4 layers, 3 query heads, 1 KV head, head_dim 128, RoPE base 10000,
# 140 prefill + 372 decode tokens = 512), in two variants, each with 8 evaluation and 32
# calibration sequences and an N = 4096, s = 8 dictionary trained on its calibration
# sequences as the real one (train-dict --epochs 4 --keep-best):
#   datasets/realism/default/   the generator at its default knobs
#   datasets/realism/fitted/    the generator with the profile fitted to the real
#                               calibration decodes (synth --fit, datasets/SYNTH.md)
# Needs datasets/make_hd128.sh first (the profile is fitted to its calibration traces).
# Deterministic; each step skipped when its output exists; gitignored output.
set -euo pipefail
bin=${1:-build/fadkv-bench}
cd "$(dirname "$0")/.."
out=datasets/realism
real=datasets/hd128
shape=(--layers 4 --q-heads 3 --kv-heads 1 --head-dim 128 --rope-theta 10000
       --prefill 140 --decode 372)
mkdir -p "$out"
if [ ! -f "$out/profile.h5" ]; then
    "$bin" synth --fit "$real"/calib/*.h5 --out "$out/profile.tmp" >/dev/null
    mv "$out/profile.tmp" "$out/profile.h5"
fi
for v in default fitted; do
    extra=()
    [ "$v" = fitted ] && extra=(--profile "$out/profile.h5")
    if [ ! -f "$out/$v/dict-n4096-s8.h5" ]; then
        rm -rf "$out/$v.tmp" && mkdir -p "$out/$v.tmp"
        "$bin" synth --out "$out/$v.tmp/eval" "${shape[@]}" "${extra[@]}" --sequences 8 \
            --first-seq 0 >/dev/null
        "$bin" synth --out "$out/$v.tmp/calib" "${shape[@]}" "${extra[@]}" --sequences 32 \
            --first-seq 100 --no-queries >/dev/null
        "$bin" train-dict --quiet --out "$out/$v.tmp/dict-n4096-s8.h5" --atoms 4096 \
            --sparsity 8 --epochs 4 --keep-best --seed 1 --jobs 2 "$out/$v.tmp"/calib/*.h5
        rm -rf "$out/$v"
        mv "$out/$v.tmp" "$out/$v"
    fi
done
