#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Codec plugins end to end. usage: test_plugin.sh FADKV_BENCH ABSMAX8.so BROKEN1.so .. BROKEN5.so
# (tests/plugins/broken.c says how each is broken). FK_SRCDIR: the source tree; FK_BUILDDIR:
# the build directory, installed with `meson install --destdir` into a staging copy that the
# example plugin is built against through pkg-config.
set -euo pipefail
bin=$(realpath "$1") tree_plugin=$(realpath "$2")
shift 2
broken=()
for b in "$@"; do broken+=("$(realpath "$b")"); done
src=${FK_SRCDIR:?} build=${FK_BUILDDIR:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# expect STATUS PATTERN CMD...: CMD exits with STATUS and its output matches PATTERN (grep -E).
expect() {
    local want=$1 pat=$2 rc=0
    shift 2
    "$@" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" != "$want" ]; then fail "$* exited $rc, expected $want"; sed 's/^/    /' "$tmp/out" >&2; return; fi
    grep -Eq -- "$pat" "$tmp/out" || { fail "$*: no /$pat/ in:"; sed 's/^/    /' "$tmp/out" >&2; }
}

# 1. the installed headers and fadkv-bench.pc build the example plugin
meson install -C "$build" --destdir "$tmp/stage" --no-rebuild --quiet >/dev/null
pc=$(find "$tmp/stage" -name fadkv-bench.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: meson install wrote no fadkv-bench.pc" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$tmp/stage
cflags=$(pkg-config --cflags fadkv-bench)
case $cflags in *"$tmp/stage"*) ;; *) fail "pkg-config --cflags fadkv-bench = '$cflags' is not the staging copy";; esac
# only the installed headers: the source tree is not on the include path
cc $cflags -std=c11 -Wall -Wextra -Werror -O2 -shared -fPIC -o "$tmp/absmax8.so" \
    "$src/examples/plugin/absmax8.c" -lm
plugin=$tmp/absmax8.so

# 2. listed, marked as a plugin with its file
expect 0 "^absmax8: example plugin" "$bin" --plugin "$plugin" codecs
expect 0 "plugin $plugin, family plugin, sha256 [0-9a-f]{16}" "$bin" --plugin "$plugin" codecs
expect 0 "absmax8 \(plugin $tree_plugin\)" "$bin" conformance "$tree_plugin"

# 3. the conformance suite passes it (both builds), exit 0
expect 0 "absmax8: 8 of 8 rules kept" "$bin" conformance "$plugin"
expect 0 "ok +determinism" "$bin" conformance "$plugin"
expect 0 "full: 8 of 8 rules kept" "$bin" conformance full

# 4. a tiny sweep: plugins = [...] in [sweep], the family column, the file's hash in the ids
"$bin" synth --out "$tmp/traces" --sequences 1 --layers 2 --q-heads 4 --kv-heads 2 \
    --head-dim 64 --prefill 24 --decode 16 >/dev/null
mkdir -p "$tmp/cfg"
cp "$plugin" "$tmp/cfg/absmax8.so"
cat >"$tmp/cfg/sweep.toml" <<TOML
[sweep]
name = "plugin-test"
output = "$tmp/results"
plugins = ["$tmp/cfg/absmax8.so"]
traces = ["$tmp/traces/*.h5"]
jobs = 1
[defaults]
n_b = 8
[[codec]]
name = "absmax8"
[[codec]]
name = "full"
TOML
"$bin" --config "$tmp/cfg/sweep.toml" --quiet || fail "the plugin sweep failed"
cells=$tmp/results/cells.csv
[ -f "$cells" ] || { echo "FAIL: no cells.csv" >&2; exit 1; }
python3 - "$cells" <<'PY' || fail "cells.csv of the plugin sweep"
import csv, math, sys
rows = {r["codec"]: r for r in csv.DictReader(open(sys.argv[1]))}
a = rows["absmax8"]
assert a["status"] == "ok", a["status"]
e = float(a["rel_err_mean"])
# int8 absmax: each coordinate within s/254 of x (s = max |x_i| <= |x|), so a row's relative
# error is at most sqrt(head_dim) / 254 = 8/254 at head_dim 64
assert 0 < e <= 8 / 254, e
assert float(rows["full"]["rel_err_mean"]) == 0
PY
grep -q "plugin_sha256=$(sha256sum "$tmp/cfg/absmax8.so" | cut -c1-64)" "$tmp/results/resolved.txt" ||
    fail "resolved.txt does not carry the plugin's sha256"
id1=$("$bin" --config "$tmp/cfg/sweep.toml" --dry-run | awk '$2 == "absmax8" {print $1}')
full1=$("$bin" --config "$tmp/cfg/sweep.toml" --dry-run | awk '$2 == "full" {print $1}')
# the same codec rebuilt differently: a new file, a new cell id (no stale result reused)
cc $cflags -std=c11 -O0 -shared -fPIC -o "$tmp/cfg/absmax8.so" "$src/examples/plugin/absmax8.c" -lm
id2=$("$bin" --config "$tmp/cfg/sweep.toml" --dry-run | awk '$2 == "absmax8" {print $1}')
full2=$("$bin" --config "$tmp/cfg/sweep.toml" --dry-run | awk '$2 == "full" {print $1}')
[ -n "$id1" ] && [ "$id1" != "$id2" ] || fail "a changed plugin file kept the cell id $id1"
[ "$full1" = "$full2" ] || fail "a changed plugin moved the built-in codec's cell id"
# --plugin and plugins = naming one file: loaded once
expect 0 "absmax8" "$bin" --plugin "$tmp/cfg/absmax8.so" --config "$tmp/cfg/sweep.toml" --dry-run

# 5. broken plugins: caught by the suite, or refused at load with the file and the reason
abi=$(sed -n 's/^#define FK_PLUGIN_ABI_VERSION \([0-9]*\).*/\1/p' "$src/codecs/core/fk_codec.h")
[ -n "$abi" ] || fail "no FK_PLUGIN_ABI_VERSION in $src/codecs/core/fk_codec.h"
expect 1 "FAIL +errors +row \(head [0-9]+, token [0-9]+\): encode\(\) reported err 0\.0+, but" \
    "$bin" conformance "${broken[0]}"
expect 1 "copy32: [0-9] of 8 rules kept" "$bin" conformance "${broken[0]}"
expect 1 "FAIL +determinism .*first run.*second" "$bin" conformance "${broken[1]}"
expect 1 "plugin ${broken[2]} was built for plugin ABI version 99, this fadkv-bench has ABI version $abi" \
    "$bin" conformance "${broken[2]}"
expect 1 "plugin ${broken[2]} was built for plugin ABI version 99" "$bin" --plugin "${broken[2]}" codecs
expect 1 "plugin ${broken[3]} is no fadkv-bench plugin: it exports no fk_plugin_abi\(\)" \
    "$bin" --plugin "${broken[3]}" codecs
expect 1 "plugin ${broken[4]}: its codec 'full' clashes with the built-in codec full" \
    "$bin" --plugin "${broken[4]}" codecs
expect 1 "plugin ${broken[5]} says ABI version $abi, but its struct fk_codec_ops is [0-9]+ bytes and this fadkv-bench's [0-9]+: it was built against another core/fk_codec.h" \
    "$bin" --plugin "${broken[5]}" codecs
expect 1 "plugin $tmp/nothing.so: no such file" "$bin" --plugin "$tmp/nothing.so" codecs
expect 1 "codec 'absmax8' clashes with the codec of plugin $plugin" \
    "$bin" --plugin "$plugin" --plugin "$tree_plugin" codecs
expect 2 "no codec named 'copy32'" "$bin" conformance copy32

[ "$fails" = 0 ] || { echo "$fails check(s) failed" >&2; exit 1; }
echo "plugin: all checks passed"
