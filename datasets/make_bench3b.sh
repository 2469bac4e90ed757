#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Data of configs/bench-3b.toml (the paper-scale replay benchmark; deterministic; skipped
# when present; about 1 GB on disk, gitignored):
#   datasets/bench3b/eval/    1 sequence, full Llama-3.2-3B shape (28 layers, 24 query heads,
#                             8 KV heads, head_dim 128), 512 prefill + 1024 decode, float16
#   datasets/bench3b/eval-pq/ the same sequence with every prefill token's query (eviction)
#   datasets/bench3b/calib/   1 calibration sequence of the same synthetic model
#   datasets/bench3b/dict-n4096-s8.h5   N = 4096 atoms per (layer, kind): 4096 sampled
#                             calibration vectors refined by 2 bcd epochs on 8192 of them
#   datasets/bench3b/basis-g1-r64.h5    the 64 leading PCA components per KV head
#                             (train-basis) of the calibration sequence, for pca
#   datasets/bench3b/calibration.h5     KVQuant's thresholds and levels (train-calib) of it
# Pass --decode D to change the decode length (the memory-flatness check uses 2048).
set -euo pipefail
bin=${1:-build/fadkv-bench}
decode=1024
[ "${2:-}" = "--decode" ] && decode=$3
cd "$(dirname "$0")/.."
out=datasets/bench3b
mkdir -p "$out/eval" "$out/calib"
if [ ! -f "$out/eval/synth-llama-3.2-3b-s1-0-d$decode.h5" ]; then
    "$bin" synth --out "$out/eval.tmp" --shape llama-3.2-3b --prefill 512 --decode "$decode" \
        --first-seq 0 >/dev/null
    mv "$out/eval.tmp"/*.h5 "$out/eval/synth-llama-3.2-3b-s1-0-d$decode.h5"
    rmdir "$out/eval.tmp"
fi
if [ ! -f "$out/eval-pq/synth-llama-3.2-3b-s1-0-d$decode.h5" ]; then
    # the same sequence with every prefill token's query too (keys, values and decode
    # queries bit for bit eval/'s): what the eviction cells that score the prompt read
    mkdir -p "$out/eval-pq"
    "$bin" synth --out "$out/eval-pq.tmp" --shape llama-3.2-3b --prefill 512 --decode "$decode" \
        --first-seq 0 --prefill-queries 1 >/dev/null
    mv "$out/eval-pq.tmp"/*.h5 "$out/eval-pq/synth-llama-3.2-3b-s1-0-d$decode.h5"
    rmdir "$out/eval-pq.tmp"
fi
if [ ! -f "$out/dict-n4096-s8.h5" ]; then
    "$bin" synth --out "$out/calib" --shape llama-3.2-3b --prefill 512 --decode 1024 \
        --first-seq 100 --no-queries >/dev/null
    "$bin" train-dict --quiet --out "$out/dict-n4096-s8.h5" --atoms 4096 --sparsity 8 \
        --epochs 2 --max-train 8192 --jobs 2 "$out"/calib/*.h5
fi
if [ ! -f "$out/basis-g1-r64.h5" ]; then
    "$bin" train-basis --quiet --max-rank 64 --out "$out/basis-g1-r64.h5" "$out"/calib/*.h5 \
        >/dev/null
fi
if [ ! -f "$out/calibration.h5" ]; then  # KVQuant's thresholds and levels (train-calib)
    "$bin" train-calib --quiet --out "$out/calibration.h5" "$out"/calib/*.h5 >/dev/null
fi
