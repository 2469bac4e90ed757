#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The docs that are generated from the code, or must name what the code has:
# 1. docs/RESULTS.md's metric reference is `fadkv-bench metrics --markdown`, between its
#    markers (tests/test_docs.sh BIN --update rewrites it);
# 2. ARCHITECTURE.md names every folder that holds C sources (harness/engine, codecs/quant,
#    ...), so that a new folder cannot go undocumented.
# usage: test_docs.sh BIN [--update]   (FK_SRCDIR: the source tree)
set -euo pipefail
bin=$1
src=${FK_SRCDIR:?}
doc=$src/docs/RESULTS.md
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" metrics --markdown > "$tmp/gen.md"
[ -s "$tmp/gen.md" ] || fail "fadkv-bench metrics --markdown printed nothing"
grep -c '^| `' "$tmp/gen.md" > "$tmp/n"
[ "$(cat "$tmp/n")" -ge 80 ] || fail "only $(cat "$tmp/n") metric rows"
begin='<!-- metrics:begin -->' end='<!-- metrics:end -->'
[ "$(grep -cxF "$begin" "$doc")" = 1 ] && [ "$(grep -cxF "$end" "$doc")" = 1 ] ||
    { echo "FAIL: $doc needs one '$begin' and one '$end' line" >&2; exit 1; }
if [ "${2:-}" = --update ]; then
    awk -v b="$begin" -v e="$end" -v gen="$tmp/gen.md" '
        $0 == b { print; while ((getline l < gen) > 0) print l; skip = 1; next }
        $0 == e { skip = 0 } !skip' "$doc" > "$tmp/doc" && cp "$tmp/doc" "$doc"
    echo "updated $doc"
fi
awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on { print } $0 == b { on = 1 }' "$doc" > "$tmp/doc.md"
if ! diff -u "$tmp/doc.md" "$tmp/gen.md" > "$tmp/diff"; then
    head -n 20 "$tmp/diff" >&2
    fail "docs/RESULTS.md's metric reference differs from 'fadkv-bench metrics --markdown' (run tests/test_docs.sh BIN --update)"
fi

# every folder with a .c or .h file (tests, examples and tools aside) named in ARCHITECTURE.md
arch=$src/ARCHITECTURE.md
n=0
while IFS= read -r d; do
    n=$((n + 1))
    grep -qF "\`$d\`" "$arch" || fail "ARCHITECTURE.md does not name the source folder \`$d\`"
done < <(cd "$src" && find harness codecs datasets -name '*.[ch]' -printf '%h\n' | sort -u)
[ "$n" -ge 15 ] || fail "only $n source folders found under $src"
echo "$(cat "$tmp/n") metric rows, $n source folders checked"
[ "$fails" = 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo PASS
