#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Many runs on one results directory (harness/store/fk_claim.h): four identical sweeps
# started together into one directory compute every cell exactly once between them and
# leave tables equal, cell for cell, to a single run's (tools/compare_results.sh); a run
# killed with SIGKILL mid-cell leaves a claim that the next run on the same host takes over;
# a claim of a live process is honoured and named.
#   test_concurrent_runs.sh BIN        (FK_SRCDIR = the source tree)
set -uo pipefail
BIN=$(realpath "$1")
SRC=${FK_SRCDIR:?FK_SRCDIR must name the source tree}
W=$(mktemp -d /tmp/fk-concurrent-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
fails=0
ok() { echo "PASS  $1"; }
bad() { echo "FAIL  $1"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

. "$(dirname "$0")"/embedded_sweep.sh
embedded_sweep_toml "$SRC" concurrent "$W/shared" 4 >"$W/sweep.toml"
N=$EMBEDDED_SWEEP_CELLS

# the reference: one run alone
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/single\"" --quiet >"$W/single.out" 2>&1
check "single run (exit $?)" test -f "$W/single/cells.csv"

# four runs at once into one directory
for i in 1 2 3 4; do
    "$BIN" --config "$W/sweep.toml" >"$W/run$i.out" 2>&1 &
    pids[$i]=$!
done
rcs=""
for i in 1 2 3 4; do
    wait "${pids[$i]}"
    rcs="$rcs$?"
done
check "the four runs exit 0 (got $rcs)" test "$rcs" = 0000
computed=0
for i in 1 2 3 4; do
    n=$(sed -n 's/.*fadkv-bench: \([0-9]*\) cell(s) run.*/\1/p' "$W/run$i.out")
    computed=$((computed + ${n:-0}))
done
check "every cell computed exactly once between them ($computed of $N)" test "$computed" = "$N"
check "no claim and no temporary file left" \
    test -z "$(find "$W/shared" -name '*.claim' -o -name '*.tmp' | head -1)"
"$SRC/tools/compare_results.sh" "$W/single" "$W/shared" >"$W/cmp.out" 2>&1
check "tables and cells equal the single run's" test $? = 0
grep -v '^note' "$W/cmp.out" | tail -3

# a run killed mid-cell: its claim stays; the next run takes it over and finishes
rm -rf "$W/killed"
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/killed\"" >"$W/kill.out" 2>&1 &
pid=$!
# look for a claim with the run stopped, so that the cell cannot finish (and its claim go)
# between the look and the kill
for _ in $(seq 1 1000); do
    kill -STOP "$pid" 2>/dev/null || break
    [ -n "$(ls "$W"/killed/cells/*.claim 2>/dev/null)" ] && break
    kill -CONT "$pid" 2>/dev/null
    sleep 0.02
done
kill -KILL "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "the killed run left its claim" test -n "$(ls "$W"/killed/cells/*.claim 2>/dev/null)"
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/killed\"" >"$W/rerun.out" 2>&1
check "the rerun takes the stale claim over and finishes (exit $?)" \
    grep -q "0 failed" "$W/rerun.out"
check "no claim left after the rerun" test -z "$(ls "$W"/killed/cells/*.claim 2>/dev/null)"
"$SRC/tools/compare_results.sh" "$W/single" "$W/killed" >"$W/cmp2.out" 2>&1
check "the resumed directory equals the single run" test $? = 0

# a claim held by a live process is honoured and named
rm -rf "$W/held"
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/held\"" --quiet >/dev/null 2>&1
first=$(ls "$W"/held/cells/*.meta | head -1)
id=$(basename "$first" .meta)
rm "$W"/held/cells/"$id".*
sleep 300 &
holder=$!
echo "$(hostname | tr './ \t' '____') $holder 0" >"$W/held/cells/$id.claim"
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/held\"" >"$W/held.out" 2>&1
check "a live claim is left alone and named" grep -q "cell $id is being computed by another run" "$W/held.out"
check "and counted" grep -q "1 cell(s) were being computed by other runs" "$W/held.out"
check "its cell was not computed" test ! -e "$W/held/cells/$id.meta"
kill "$holder"
wait "$holder" 2>/dev/null
"$BIN" --config "$W/sweep.toml" --set "sweep.output=\"$W/held\"" >"$W/held2.out" 2>&1
check "once its process is gone the cell is computed" test -e "$W/held/cells/$id.meta"

echo "$fails failure(s)"
[ "$fails" = 0 ]
