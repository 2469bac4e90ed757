#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The layer check, run by every build: each source under harness/FLOOR/, codecs/FLOOR/ and
# datasets/FLOOR/ may include only its own floor and the floors the table allows (the
# `layers` list of the top meson.build, passed as "floor:allowed allowed ..." words).
# A wrong-way include fails the build with the file, the line and what was allowed.
# usage: check_layers.sh SRCDIR STAMP FLOOR:ALLOWED...
set -euo pipefail
src=$1 stamp=$(realpath -m "$2")
shift 2
declare -A allow=()
for spec in "$@"; do allow[${spec%%:*}]=" ${spec#*:} "; done
# Generated headers that live in the build directory.
generated=" fk_version.h fk_registry_list.h "
bad=0
cd "$src"
while IFS= read -r -d '' f; do
    floor=$(cut -d/ -f2 <<<"$f")
    [[ $f == */*/* ]] || floor=$(cut -d/ -f1 <<<"$f")   # e.g. codecs/fk_registry.c
    if [[ $floor == codecs ]]; then floor=core; fi        # the registry sits on core
    if [[ -z ${allow[$floor]+x} ]]; then
        echo "$f: folder '$floor' is not a floor of the layers table in meson.build" >&2
        bad=1; continue
    fi
    while IFS=: read -r line inc; do
        if [[ $inc != */* ]]; then
            [[ $generated == *" $inc "* ]] && continue
            echo "$f:$line: #include \"$inc\" names no folder (write \"FLOOR/$inc\")" >&2
            bad=1; continue
        fi
        to=${inc%%/*}
        [[ $to == "$floor" || ${allow[$floor]} == *" $to "* ]] && continue
        echo "$f:$line: #include \"$inc\": floor '$floor' may include only itself and:${allow[$floor]}" >&2
        bad=1
    done < <(awk '/^[ \t]*#[ \t]*include[ \t]*"/ { split($0, p, "\""); print FNR ":" p[2] }' "$f")
done < <(find harness codecs datasets -name '*.[ch]' -print0 | sort -z)
[ "$bad" = 0 ] || { echo "layer check failed: see the layers table in meson.build" >&2; exit 1; }
touch "$stamp"
