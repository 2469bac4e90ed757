#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Cost that grows as the work does: one synthetic decode of the paper's head shape (24
# query heads, 8 KV heads, head_dim 128; 512 prefill tokens; LAYERS layers) at several
# decode lengths, through lexico and fadkv (N 4096, s 8, the paper-3b preset), kivi (2-bit)
# and SnapKV over the exact cache, attention fidelity at every 16th decode step, each cell in
# its own process, one job, in process (--no-isolate: the peak is the cell's own).
# Prints per codec and length: coding time (the codec's encode calls and the eviction
# policy's hooks, t_encode + t_policy), attention time (t_attn), and peak resident memory;
# then checks
#   1. coding time linear in tokens: t(16k) / t(4k) <= 1.3 x T(16k) / T(4k);
#   2. attention time as its stride implies: the evaluations at step t cost O(t), so
#      t_attn(16k) / t_attn(4k) within 0.7..1.3 x the ratio of sum over evaluated steps of t;
#   3. peak memory bounded by one layer's working set plus the results:
#        peak(T) <= peak(T0) + (T - T0) x B,  B = 2 x H (2 m 4) + Hq m 4 bytes per token,
#      the layer's K and V rows in float32 as read and their stored or reconstructed copy,
#      and its queries (T0 the shortest length: the layers are replayed one at a time, so
#      the layer count does not enter; the results grow by a few bytes per step).
# usage: tools/bench_scale.sh [BIN] [--lengths 1024,4096,16384] [--layers 2] [--dir DIR]
# Exit 0 when every check holds, 1 otherwise. Takes minutes (the 16k cells dominate).
set -euo pipefail
bin=build/fadkv-bench
lengths=1024,4096,16384
layers=2
dir=
while [ $# -gt 0 ]; do
    case $1 in
    --lengths) lengths=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -*) echo "usage: $0 [BIN] [--lengths L,L,...] [--layers K] [--dir DIR]" >&2; exit 2 ;;
    *) bin=$1; shift ;;
    esac
done
bin=$(realpath "$bin")
src=$(cd "$(dirname "$0")/.." && pwd)
[ -n "$dir" ] || dir=$(mktemp -d /tmp/fk-scale-XXXXXX)
mkdir -p "$dir"
H=8 HQ=24 M=128 P=512 STRIDE=16
IFS=, read -r -a L <<< "$lengths"

# data: one trace per length (the same sequence: same seeds), a dictionary from another
for d in "${L[@]}"; do
    [ -f "$dir/tr-$d/trace.h5" ] && continue
    mkdir -p "$dir/tr-$d.tmp"
    "$bin" synth --out "$dir/tr-$d.tmp" --layers "$layers" --prefill $P --decode "$d" \
        --prefill-queries 1 >/dev/null
    mkdir -p "$dir/tr-$d" && mv "$dir/tr-$d.tmp"/*.h5 "$dir/tr-$d/trace.h5" && rm -rf "$dir/tr-$d.tmp"
done
if [ ! -f "$dir/dict.h5" ]; then
    "$bin" synth --out "$dir/calib" --layers "$layers" --prefill $P --decode 1024 \
        --first-seq 100 --no-queries >/dev/null
    "$bin" train-dict --quiet --out "$dir/dict.h5" --atoms 4096 --sparsity 8 --epochs 2 \
        --max-train 8192 --jobs 2 "$dir"/calib/*.h5 >/dev/null
fi

codec_block() {
    case $1 in
    lexico) printf '[[codec]]\nname = "lexico"\npreset = "paper-3b"\n' ;;
    fadkv) printf '[[codec]]\nname = "fadkv"\npreset = "paper-3b"\n' ;;
    kivi) printf '[[codec]]\nname = "kivi"\n' ;;
    snapkv) printf '[[codec]]\nname = "full"\nevict = "snapkv"\nratio = 0.5\n' ;;
    esac
}
meta() { awk -F'\t' -v k="$2" '$1 == k { print $2 }' "$1"; }

printf '%-8s %7s %7s %10s %12s %10s %10s\n' codec decode tokens coding_s us_per_token attn_s peak_MiB
declare -A tc ta pk
for c in lexico fadkv kivi snapkv; do
    for d in "${L[@]}"; do
        out=$dir/res-$c-$d
        rm -rf "$out"
        { printf '[sweep]\nname = "scale"\noutput = "%s"\njobs = 1\nattention = true\n' "$out"
          printf 'attn_stride = %d\nrecall = false\n[defaults]\na_len = 1\n' $STRIDE
          printf '[[dataset]]\nname = "d"\ntraces = ["%s"]\ndictionary = "%s"\n' \
              "$dir/tr-$d/trace.h5" "$dir/dict.h5"
          codec_block $c; } > "$dir/$c-$d.toml"
        peak=$( { /usr/bin/time -f '%M' "$bin" --config "$dir/$c-$d.toml" --quiet --no-isolate \
                  >/dev/null 2>"$dir/$c-$d.err"; } 2>&1; tail -n 1 "$dir/$c-$d.err")
        m=$(ls "$out"/cells/*.meta)
        [ "$(meta "$m" status)" = ok ] || { echo "cell $c at $d failed: $(meta "$m" error)" >&2; exit 1; }
        code=$(awk -F'\t' '$1 == "t_encode" || $1 == "t_policy" { s += $2 } END { print s }' "$m")
        attn=$(meta "$m" t_attn)
        T=$((P + d))
        tc[$c,$d]=$code ta[$c,$d]=$attn pk[$c,$d]=$peak
        awk -v c=$c -v d=$d -v T=$T -v t=$code -v a=$attn -v p=$peak 'BEGIN {
            printf "%-8s %7d %7d %10.3f %12.3f %10.3f %10.1f\n", c, d, T, t, 1e6 * t / T, a, p / 1024 }'
    done
done

# the checks, between the last two lengths and from the first
n=${#L[@]}
a=${L[$((n - 2))]} b=${L[$((n - 1))]} lo=${L[0]}
fails=0
echo
for c in lexico fadkv kivi snapkv; do
    res=$(awk -v c=$c -v ta="${tc[$c,$a]}" -v tb="${tc[$c,$b]}" -v aa="${ta[$c,$a]}" -v ab="${ta[$c,$b]}" \
              -v pa="${pk[$c,$lo]}" -v pb="${pk[$c,$b]}" -v A=$a -v B=$b -v LO=$lo -v P=$P \
              -v S=$STRIDE -v H=$H -v HQ=$HQ -v M=$M 'BEGIN {
        TA = P + A; TB = P + B; TL = P + LO
        lin = (tb / ta) / (TB / TA)
        # attention: an evaluation at decode step t (t = 0, S, 2S, ...) reads the P + t + 1
        # visible tokens
        wa = 0; for (t = 0; t < A; t += S) wa += P + t + 1
        wb = 0; for (t = 0; t < B; t += S) wb += P + t + 1
        att = (ab / aa) / (wb / wa)
        Bt = 2 * H * (2 * M * 4) + HQ * M * 4                  # bytes per token
        bound = pa + (TB - TL) * Bt / 1024                       # KiB, as /usr/bin/time
        ok = lin <= 1.3 && att >= 0.7 && att <= 1.3 && pb <= bound
        printf "%s: coding %.2fx linear (<= 1.3); attention %.2fx its stride (0.7..1.3); peak %.0f MiB <= %.0f MiB (%d B/token above %d tokens): %s\n", \
               c, lin, att, pb / 1024, bound / 1024, Bt, TL, ok ? "ok" : "FAIL"
    }')
    echo "$res"
    case $res in *FAIL) fails=$((fails + 1)) ;; esac
done
echo "data and results in $dir"
[ "$fails" = 0 ]
