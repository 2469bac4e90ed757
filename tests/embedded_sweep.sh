# SPDX-License-Identifier: MIT
# The small sweep of the tests that run many fadkv-bench processes on one results directory
# (test_concurrent_runs.sh, test_slurm.sh): 13 cells of lexico, fadkv and uniform on the
# committed babyllama-tok105 traces and dictionary, one thread. Sourced, then:
#   embedded_sweep_toml SRC NAME OUTPUT ATTN_STRIDE >SWEEP.toml
# (SRC = the source tree; attention at every decode step, stride 1, makes a cell take a few
# tenths of a second on one core, stride 4 about a tenth.)
# shellcheck shell=bash
# shellcheck disable=SC2034  # used by the tests that source this file
EMBEDDED_SWEEP_CELLS=13
embedded_sweep_toml() {
    cat <<EOF
[sweep]
name = "$2"
traces = ["$1/datasets/embedded/babyllama-tok105-*.h5"]
dictionary = "$1/datasets/dicts/babyllama-tok105.h5"
output = "$3"
jobs = 1
attention = true
attn_stride = $4

[[codec]]
name = "lexico"
n_b = 16
grid = { s = [2, 3, 4, 5, 6, 7, 8] }

[[codec]]
name = "fadkv"
n_b = 16
n = 32
grid = { s = [2, 4, 8] }

[[codec]]
name = "uniform"
n_b = 16
grid = { bits = [2, 4, 8] }
EOF
}
