#!/bin/sh
# SPDX-License-Identifier: MIT
# Regenerates the embedded real traces (see README.md in this folder).
# usage: datasets/embedded/make_traces.sh BUILD/fadkv-bench [MODELS_DIR]
# MODELS_DIR defaults to $FK_SHARED/data/models (FK_SHARED defaults to /work/shared).
set -eu
exe=$1
models=${2:-${FK_SHARED:-/work/shared}/data/models}
here=$(cd "$(dirname "$0")" && pwd)
for set in eval train; do
    if [ "$set" = eval ]; then dir=$here; else dir=$here/train; fi
    for m in babyllama-tok105 aidreams-260k fortune-byte-4L fortune-hd128; do
        # fortune-hd128 decodes fortune-byte-4L's prompts (same tokenizer and text; its own
        # prompt files are the long ones of datasets/make_hd128.sh)
        p=$m; [ "$m" = fortune-hd128 ] && p=fortune-byte-4L
        "$exe" trace --model "$models/$m/model.bin" --tokenizer "$models/$m/tokenizer.bin" \
            --prompts "$dir/prompts/$p.txt" --steps 100 --temperature 0.8 --top-p 0.95 \
            --seed 42 --ignore-eos --encoding float16 --out "$dir"
    done
done
