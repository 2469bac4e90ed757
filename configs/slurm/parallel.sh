#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A sweep in N shards run by GNU parallel, each shard into its own directory
# (OUT_DIR.shards/sI), then merged into OUT_DIR with `fadkv-bench merge`:
#
#   configs/slurm/parallel.sh SWEEP.toml OUT_DIR [N [FADKV-BENCH ARGS...]]
#
# N defaults to the number of cores; each shard runs one thread. The shards are split by
# estimated cost, so they finish together. Rerunning the same command resumes: finished
# cells are skipped, and merge is repeated. FADKV_BENCH names the binary (default:
# fadkv-bench on PATH); PARALLEL_OPTS adds options to parallel, e.g. "--sshlogin
# 4/node1,4/node2 --workdir ." to spread the shards over machines that see the same files.
# (One shared directory for all shards works too, without merge: the cells are claimed,
# as for a Slurm job array, see sweep.sbatch.)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 SWEEP.toml OUT_DIR [N [FADKV-BENCH ARGS...]]" >&2; exit 2; }
config=$1 out=$2
n=${3:-$(nproc)}
shift $(($# < 3 ? $# : 3))
bin=${FADKV_BENCH:-fadkv-bench}

# -q: parallel passes each argument as it is (without it a shell would strip the quotes
# that make sweep.output a TOML string).
# shellcheck disable=SC2086
parallel -q ${PARALLEL_OPTS:-} --jobs "$n" --line-buffer --tagstring 'shard {}:' \
    "$bin" --config "$config" --shard "{}/$n" --jobs 1 \
    --set "sweep.output=\"$out.shards/s{}\"" "$@" ::: $(seq 0 $((n - 1)))
shards=()
for i in $(seq 0 $((n - 1))); do shards+=("$out.shards/s$i"); done
"$bin" merge "$out" "${shards[@]}"
