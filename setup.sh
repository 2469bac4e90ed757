#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fadkv-bench setup: installs the Debian packages it needs (when missing), configures and
# builds, then optionally runs the default job or the tests. Idempotent and
# non-interactive; runs as root or through sudo.
#
#   ./setup.sh          install what is missing, configure, build
#   ./setup.sh run      ... then make the default data and run configs/default.toml,
#                       writing results/default (CSV, HDF5) and its figures
#   ./setup.sh test     ... then run every test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-build}
case "$mode" in build|run|test) ;; *) echo "usage: $0 [build|run|test]" >&2; exit 2 ;; esac

# Packages: the C toolchain and libraries; gnuplot for figures; python3 with numpy/h5py
# (Debian's, for the oracle tests and the dumper). The tests also need the oracles'
# modules, scikit-learn (tests/sklearn_omp.py) and torch (tests/test_python_tools.py), so
# that no oracle test is skipped, and Slurm, munge and GNU parallel (tests/test_slurm.sh
# starts a private cluster of its own and needs no system service), and Chromium
# (tests/test_report.sh opens the HTML report headless).
pkgs=(gcc libc6-dev pkg-config meson ninja-build git libhdf5-dev hdf5-tools libgsl-dev
      libopenblas-dev check gnuplot-nox python3 python3-numpy python3-h5py)
[ "$mode" = test ] && pkgs+=(python3-sklearn python3-torch slurm-wlm munge parallel chromium)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
    meson setup build -Dwerror=true --buildtype=release >/dev/null
fi
meson compile -C build >/dev/null
bin=build/fadkv-bench

if [ "$mode" = run ]; then
    # The synthetic Llama-3.2-3B-shaped trace (4 of its 28 layers, to keep the default job
    # short) and its calibration data are generated (deterministic), then its dictionary is
    # trained on the calibration sequences only. The real traces and their dictionaries are
    # committed under datasets/embedded and datasets/dicts.
    datasets/make_synth.sh "$bin"
    "$bin" --config configs/default.toml
    "$bin" plot results/default
    echo "setup: results in results/default (cells.csv, summary.csv), figures in results/default/figures"
fi

if [ "$mode" = test ]; then
    log=$(mktemp)
    status=0
    meson test -C build --print-errorlogs --num-processes 2 | tee "$log" || status=$?
    ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' "$log")
    fail=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' "$log")
    skip=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$log")
    rm -f "$log"
    echo "${ok:-0} passed, ${fail:-0} failed, ${skip:-0} skipped"
    exit $status
fi
