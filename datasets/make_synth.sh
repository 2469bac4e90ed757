#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Makes the synthetic data of the default job (deterministic; skipped when present):
#   datasets/synth/eval/   2 evaluation sequences, Llama-3.2-3B head shape (24 query heads,
#                          8 KV heads, head_dim 128), 4 layers, 256 prefill + 512 decode
#   datasets/synth/eval-pq/  the same 2 sequences with every prefill token's query too (the
#                          keys, values and decode queries are eval/'s bit for bit): what the
#                          eviction policies that score the prompt (snapkv, h2o) read
#   datasets/synth/calib/  2 calibration sequences of the same model (other sequence seeds)
#   datasets/synth/dict-n1024-s8.h5   dictionary trained on calib/ only (N = 1024, s = 8)
#   datasets/synth/basis-g1.h5        PCA bases per KV head (train-basis) on calib/ only, with
#                          pre-RoPE keys (traces made before the traces' RoPE attributes
#                          existed give none: remove datasets/synth and run this again)
#   datasets/synth/calibration.h5     KVQuant's thresholds and levels (train-calib), calib/ only
# With --paper, also the dictionaries of the paper configs (Table 4/5 at N = 4096, and the
# N x s grid of Fig. 3d): dict-n{512,2048,4096}-s8.h5, trained the same way on 8 more
# calibration sequences (calib-paper/).
set -euo pipefail
bin=${1:-build/fadkv-bench}
paper=${2:-}
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
if [ ! -f "$out/basis-g1.h5" ]; then  # also for data made before train-basis existed
    "$bin" train-basis --quiet --out "$out/basis-g1.h5" "$out"/calib/*.h5 >/dev/null
fi
if [ ! -f "$out/calibration.h5" ]; then  # likewise, train-calib (KVQuant)
    "$bin" train-calib --quiet --out "$out/calibration.h5" "$out"/calib/*.h5 >/dev/null
fi
if [ ! -d "$out/eval-pq" ]; then  # eval/ again with every prefill token's query (eviction)
    rm -rf "$out/eval-pq.tmp"
    "$bin" synth --out "$out/eval-pq.tmp" "${common[@]}" --first-seq 0 \
        --prefill-queries 1 >/dev/null
    mv "$out/eval-pq.tmp" "$out/eval-pq"
fi
if [ "$paper" = --paper ]; then
    if [ ! -d "$out/calib-paper" ]; then  # 8 calibration sequences (other seeds)
        "$bin" synth --out "$out/calib-paper.tmp" "${common[@]}" --sequences 8 \
            --first-seq 200 --no-queries >/dev/null
        mv "$out/calib-paper.tmp" "$out/calib-paper"
    fi
    for n in 512 2048 4096; do
        [ -f "$out/dict-n$n-s8.h5" ] && continue
        "$bin" train-dict --quiet --out "$out/dict-n$n-s8.h5" --atoms $n --sparsity 8 \
            --epochs 4 --jobs 2 --max-train 32768 "$out"/calib-paper/*.h5
    done
fi
