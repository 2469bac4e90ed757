#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Real decode traces and dictionaries at the paper's head shape (configs/paper-real.toml),
# from the llama2.c model fortune-hd128 ($FK_SHARED/data/models/fortune-hd128: head_dim 128,
# 3 query heads per KV head as Llama-3.2-3B, 4 layers, 1 KV head, context 512 = seq_len).
# Deterministic; every step is skipped when its output exists; gitignored output:
#   datasets/hd128/eval/fortune-hd128-EE.h5   8 evaluation decodes, one per line of
#       datasets/embedded/prompts/fortune-hd128.txt (prompts of 123-147 bytes = the
#       prefill, BOS included), sampled to the full 512-token context
#   datasets/hd128/calib/fortune-hd128-CC.h5  32 calibration decodes of the same kind from the
#       OTHER prompts, datasets/embedded/train/prompts/fortune-hd128.txt (16,384 tokens)
#   datasets/hd128/dict-nN-s8.h5   per-layer K and V dictionaries, N = 4096, 2048, 1024, 512,
#       s = 8, trained (bcd) on the calibration traces only
#   datasets/hd128/basis.h5        PCA basis of the calibration traces (train-basis)
#   datasets/hd128/calibration.h5  KVQuant's thresholds and levels of them (train-calib)
# Sampling as the embedded traces: temperature 0.8, top-p 0.95, --ignore-eos, float16; seed
# 42 + line index (each prompt its own stream of random numbers).
# usage: datasets/make_hd128.sh [BUILD/fadkv-bench] [MODELS_DIR]
set -euo pipefail
bin=${1:-build/fadkv-bench}
models=${2:-${FK_SHARED:-/work/shared}/data/models}
m=$models/fortune-hd128
cd "$(dirname "$0")/.."
out=datasets/hd128
ctx=512                                   # the model's seq_len: never decode past it
mkdir -p "$out/eval" "$out/calib"

# decode PROMPTS_FILE DIR: one trace per line, each to exactly $ctx tokens
decode() {
    local i=0 line
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        local f
        f=$(printf '%s/fortune-hd128-%02d.h5' "$2" "$i")
        if [ ! -f "$f" ]; then
            # byte-level tokenizer: prompt tokens = BOS + one per byte
            local steps=$((ctx - 1 - $(printf '%s' "$line" | wc -c)))
            rm -rf "$2.tmp"
            "$bin" trace --model "$m/model.bin" --tokenizer "$m/tokenizer.bin" \
                --prompt "$line" --steps "$steps" --temperature 0.8 --top-p 0.95 \
                --seed $((42 + i)) --ignore-eos --encoding float16 --quiet --out "$2.tmp" \
                >/dev/null
            mv "$2.tmp/fortune-hd128-00.h5" "$f"
            rmdir "$2.tmp"
        fi
        i=$((i + 1))
    done <"$1"
}
decode datasets/embedded/prompts/fortune-hd128.txt "$out/eval"
decode datasets/embedded/train/prompts/fortune-hd128.txt "$out/calib"

for n in 512 1024 2048 4096; do
    if [ ! -f "$out/dict-n$n-s8.h5" ]; then
        "$bin" train-dict --quiet --out "$out/dict-n$n-s8.tmp" --atoms "$n" --sparsity 8 \
            --epochs 4 --keep-best --seed 1 --jobs 2 "$out"/calib/*.h5
        mv "$out/dict-n$n-s8.tmp" "$out/dict-n$n-s8.h5"
    fi
done
if [ ! -f "$out/basis.h5" ]; then
    "$bin" train-basis --quiet --out "$out/basis.tmp" "$out"/calib/*.h5 >/dev/null
    mv "$out/basis.tmp" "$out/basis.h5"
fi
if [ ! -f "$out/calibration.h5" ]; then
    "$bin" train-calib --quiet --out "$out/calibration.h5" "$out"/calib/*.h5 >/dev/null
fi
