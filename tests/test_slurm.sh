#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sweeps on a real Slurm cluster: a private single-node cluster (Debian's slurm-wlm and
# munge: its own munge key and munged socket, its own slurm.conf on free ports, every file in
# one temporary directory, no systemd, no slurmdbd) runs configs/slurm/sweep.sbatch as a job
# array of 4 shards into ONE results directory. One array task is killed with SIGKILL
# mid-cell and requeued; the array finishes with every cell computed once (the killed one
# once more), no claim or temporary file left, and the directory equal cell for cell to an
# unsharded run (tools/compare_results.sh). configs/slurm/parallel.sh (GNU parallel, 4
# shards into their own directories, then merge) gives the same. The shards' cell counts,
# estimated costs and measured times are printed. The cluster is torn down on exit.
#   test_slurm.sh BIN        (FK_SRCDIR = the source tree; exit 77 = skip without the
#                             packages or without root: ./setup.sh test installs them)
set -uo pipefail
BIN=$(realpath "$1")
SRC=${FK_SRCDIR:?FK_SRCDIR must name the source tree}
PATH=$PATH:/usr/sbin:/sbin      # munged, slurmctld and slurmd live there
for b in munged munge unmunge slurmctld slurmd sbatch squeue scontrol sinfo scancel parallel; do
    command -v "$b" >/dev/null || {
        echo "SKIP: $b not found (apt-get install slurm-wlm munge parallel)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: the private cluster runs its daemons as root"; exit 77; }

T0=$(date +%s.%N)
W=$(mktemp -d /tmp/fk-slurm-XXXXXX)
chmod 755 "$W"                  # munged wants its socket's directories searchable by all
fails=0
ok() { echo "PASS  $1"; }
bad() { echo "FAIL  $1"; fails=$((fails + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
elapsed() { echo "$(date +%s.%N) $T0" | awk '{printf "%.1f", $1 - $2}'; }

# The logs that say why a step failed.
logs() {
    local f d
    for d in munged slurmctld slurmd; do   # a daemon's .out only when it wrote no log
        [ -s "$W/$d.log" ] && rm -f "$W/$d.out"
    done
    for f in "$W"/munged.log "$W"/munged.out "$W"/slurmctld.log "$W"/slurmctld.out \
             "$W"/slurmd.log "$W"/slurmd.out "$W"/task-*.out; do
        [ -s "$f" ] || continue
        echo "---- ${f#"$W"/} (last 25 lines but the PMIx plugin's)"
        grep -v -i pmix "$f" | tail -n 25
    done
    echo "---- squeue"; squeue 2>&1 | head -20
    echo "---- sinfo"; sinfo 2>&1 | head -5
}
die() { echo "FAIL  $1"; logs; exit 1; }
# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s; fails naming WHAT.
wait_for() {
    local secs=$1 what=$2 end
    shift 2
    end=$(($(date +%s) + secs))
    until "$@"; do
        [ "$(date +%s)" -lt "$end" ] || die "timeout after ${secs} s waiting for $what"
        sleep 0.1
    done
}

# Teardown: cancel the jobs, stop slurmd, slurmctld and munged, then end whatever process
# still has a file or its working directory in $W (job steps, their shells, fadkv-bench).
daemons=()
torn=0
alive() { kill -0 "$1" 2>/dev/null; }
ours() {  # the processes with their cwd or an open file under $W
    local p l
    for p in /proc/[0-9]*; do
        [ "${p#/proc/}" = $$ ] && continue
        for l in "$p"/cwd "$p"/fd/*; do
            case $(readlink "$l" 2>/dev/null) in "$W"/*|"$W") echo "${p#/proc/}"; break ;; esac
        done
    done
}
teardown() {
    [ $torn = 1 ] && return
    torn=1
    local p i
    if [ ${#daemons[@]} -gt 0 ]; then
        scancel --quiet --user=root >/dev/null 2>&1
        for _ in $(seq 1 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do   # slurmd, slurmctld, munged
        p=${daemons[$i]}
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 1 100); do alive "$p" || break; sleep 0.1; done
        alive "$p" && kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
}
trap 'teardown; rm -rf "$W"' EXIT
trap 'exit 1' INT TERM

# ---- the cluster -----------------------------------------------------------------------
# Two free TCP ports, derived from the pid (a port is in use when /proc/net/tcp* lists it
# in any state).
port_used() {
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v h="$hex" 'substr($2, length($2) - 4) == h { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
base=$((20000 + ($$ * 2) % 30000))
for _ in $(seq 1 100); do
    port_used "$base" || port_used $((base + 1)) || break
    base=$((base + 2 > 50000 ? 20000 : base + 2))
done
CTLD_PORT=$base SLURMD_PORT=$((base + 1))

mkdir -p "$W"/munge "$W"/state "$W"/spool
dd if=/dev/urandom of="$W"/munge/munge.key bs=1024 count=1 status=none
chmod 400 "$W"/munge/munge.key
SOCK=$W/munge/munge.socket
munged --foreground --socket="$SOCK" --key-file="$W"/munge/munge.key \
    --log-file="$W"/munged.log --pid-file="$W"/munge/munged.pid \
    --seed-file="$W"/munge/munged.seed >"$W"/munged.out 2>&1 &
daemons+=($!)
munge_ok() { munge -S "$SOCK" -n 2>/dev/null | unmunge -S "$SOCK" >/dev/null 2>&1; }
wait_for 15 "munged to answer on its socket" munge_ok

CPUS=$(($(nproc) < 2 ? 1 : 2))
cat >"$W"/slurm.conf <<EOF
# a private single-node cluster of tests/test_slurm.sh
ClusterName=fktest
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it starts again (default 120 s)
AuthInfo=socket=$SOCK,cred_expire=5
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# a requeued task becomes eligible with no event that wakes the scheduler: look every 1-2 s
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=2
MailProg=/bin/true
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/slurmd.pid
SlurmctldLogFile=$W/slurmctld.log
SlurmdLogFile=$W/slurmd.log
NodeName=fknode NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=500 State=UNKNOWN
PartitionName=fk Nodes=fknode Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$W/slurm.conf
slurmctld -D -f "$SLURM_CONF" >"$W"/slurmctld.out 2>&1 &
daemons+=($!)
ctld_up() { scontrol ping 2>/dev/null | grep -q "is UP"; }
wait_for 30 "slurmctld to answer (port $CTLD_PORT)" ctld_up
slurmd -D -N fknode -f "$SLURM_CONF" >"$W"/slurmd.out 2>&1 &
daemons+=($!)
node_idle() { [ "$(sinfo -h -n fknode -o %T 2>/dev/null)" = idle ]; }
wait_for 30 "node fknode to be idle" node_idle
echo "cluster up in $(elapsed) s: slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT, $CPUS CPU(s)"

# ---- the sweep and its unsharded reference -----------------------------------------------
# 13 cells of a few tenths of a second each (attention at every decode step)
. "$(dirname "$0")"/embedded_sweep.sh
embedded_sweep_toml "$SRC" slurm "$W/single" 1 >"$W"/sweep.toml
N=$EMBEDDED_SWEEP_CELLS
"$BIN" --config "$W"/sweep.toml --quiet >"$W"/single.out 2>&1
check "unsharded reference run (exit $?)" test -f "$W"/single/cells.csv

# shard balance, as the array tasks will split the cells
echo "shard  cells  estimated GMAC (sum of the dry run's per-cell figures)"
total_cells=0
for i in 0 1 2 3; do
    "$BIN" --config "$W"/sweep.toml --dry-run --shard "$i/4" >"$W/dry$i.out" 2>&1
    cells=$(sed -n 's/^\([0-9]*\) cell(s) in this shard.*/\1/p' "$W/dry$i.out")
    gmac=$(awk '$NF == "GMAC" { s += $(NF - 1) } END { printf "%.1f", s }' "$W/dry$i.out")
    printf '%3d/4  %5s  %s\n' "$i" "${cells:-?}" "$gmac"
    total_cells=$((total_cells + ${cells:-0}))
done
check "the 4 shards hold the $N cells between them (got $total_cells)" test "$total_cells" = "$N"

# ---- the job array into one shared directory -------------------------------------------
T1=$(date +%s.%N)
jid=$(FADKV_BENCH=$BIN sbatch --parsable --array=0-3 --chdir="$W" \
          --output="$W/task-%A_%a.out" "$SRC"/configs/slurm/sweep.sbatch \
          "$W"/sweep.toml "$W"/shared 2>"$W"/sbatch.err)
jid=${jid%%;*}
[ -n "$jid" ] || { cat "$W"/sbatch.err; die "sbatch did not submit the array"; }
echo "array job $jid submitted"

# Kill one task mid-cell: a claim whose process belongs to this array is found, the process
# is stopped, and if it still holds that claim (its cell unfinished) it is killed.
victim='' vpid='' vcell=''
env_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n "s/^$2=//p"; }
find_victim() {
    local f pid
    for f in "$W"/shared/cells/*.claim; do
        [ -f "$f" ] || continue
        read -r _ pid _ <"$f" 2>/dev/null || continue
        if [ -z "$pid" ] || [ "$(env_of "$pid" SLURM_ARRAY_JOB_ID)" != "$jid" ]; then
            continue
        fi
        kill -STOP "$pid" 2>/dev/null || continue
        if [ "$(cut -d' ' -f2 "$f" 2>/dev/null)" = "$pid" ] &&
           [ ! -e "${f%.claim}.meta" ]; then
            victim=$(env_of "$pid" SLURM_ARRAY_TASK_ID) vpid=$pid
            vcell=$(basename "$f" .claim)
            kill -KILL "$pid"
            return 0
        fi
        kill -CONT "$pid"
    done
    return 1
}
wait_for 60 "a task of array $jid to claim a cell" find_victim
echo "killed task ${jid}_$victim (fadkv-bench pid $vpid) with SIGKILL mid-cell $vcell"
gone() { ! alive "$vpid"; }
wait_for 10 "the killed process to be gone" gone
# Its claim stays until a run on this host starts (another task of the array, or the
# requeued one) and removes it as stale; its cell is unfinished until the requeued task runs.
check "the killed task's cell is unfinished" test ! -e "$W/shared/cells/$vcell.meta"
if [ -f "$W/shared/cells/$vcell.claim" ]; then
    echo "      its claim is still there (held by dead pid $vpid)"
else
    echo "      its claim was already removed as stale by a task that started after the kill"
fi
state_of() { scontrol -o show job "$1" 2>/dev/null | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p'; }
victim_failed() { [ "$(state_of "${jid}_$victim")" = FAILED ]; }
wait_for 30 "task ${jid}_$victim to be FAILED" victim_failed
scontrol requeue "${jid}_$victim" >"$W"/requeue.out 2>&1 ||
    { cat "$W"/requeue.out; die "scontrol requeue ${jid}_$victim"; }
T3=$(date +%s.%N)
victim_started() { local s; s=$(state_of "${jid}_$victim"); [ -n "$s" ] && [ "$s" != PENDING ]; }
wait_for 60 "requeued task ${jid}_$victim to start" victim_started
echo "requeued ${jid}_$victim; it started again $(echo "$(date +%s.%N) $T3" |
    awk '{ printf "%.1f", $1 - $2 }') s later (Slurm waits AuthInfo's cred_expire, 5 s here)"
array_done() { [ -z "$(squeue -h -j "$jid" 2>/dev/null)" ]; }
wait_for 120 "array $jid to finish" array_done
T2=$(date +%s.%N)

states=''
for i in 0 1 2 3; do states="$states $(state_of "${jid}_$i")"; done
check "every array task COMPLETED (got$states)" \
    test "$states" = " COMPLETED COMPLETED COMPLETED COMPLETED"
check "the killed task ran again (Restarts=1)" \
    sh -c "scontrol -o show job ${jid}_$victim | grep -q ' Restarts=1 '"
meta=$(find "$W"/shared/cells -name '*.meta' | wc -l)
statuses=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "status") c = i; next }
                    { print $c }' "$W"/shared/cells.csv 2>/dev/null | sort | uniq -c | xargs)
check "every cell finished ($meta .meta files, cells.csv: $statuses)" \
    test "$meta/$statuses" = "$N/$N ok"
check "no claim and no temporary file left" \
    test -z "$(find "$W"/shared -name '*.claim' -o -name '*.tmp' | head -1)"
# every cell was started once by the tasks, the killed one once more
grep -h -o '^\[[0-9]*/[0-9]*\] [0-9a-f]*' "$W"/task-*.out | cut -d' ' -f2 | sort | uniq -c \
    >"$W"/starts.txt
twice=$(awk '$1 == 2 { print $2 }' "$W"/starts.txt)
check "each of the $N cells computed once, the killed $vcell twice" \
    test "$(wc -l <"$W"/starts.txt)/$(awk '$1 > 2 || $1 < 1' "$W"/starts.txt | wc -l)/$twice" \
        = "$N/0/$vcell"
check "the requeued task computed the killed cell" \
    sh -c "sed -n '/restart 1)/,\$p' '$W/task-${jid}_$victim.out' | grep -q '] $vcell '"
"$SRC"/tools/compare_results.sh "$W"/single "$W"/shared >"$W"/cmp.out 2>&1
check "the shared directory equals the unsharded run cell for cell" test $? = 0
grep -v '^note' "$W"/cmp.out | tail -2
echo "task  cells run  wall (fadkv-bench's own figure, last run)"
for i in 0 1 2 3; do
    sed -n 's/^fadkv-bench: \([0-9]*\) cell(s) run, .* already done; \([0-9.]*\) s;.*/\1 \2/p' \
        "$W/task-${jid}_$i.out" | tail -1 |
        awk -v t="$i" '{ printf "%4d  %9d  %4.1f s\n", t, $1, $2 }'
done
echo "the array took $(echo "$(date +%s.%N) $T1 $T2" |
    awk '{ printf "%.1f", $3 - $2 }') s, the requeue's cred_expire wait included"

# ---- GNU parallel: 4 shards into their own directories, then merge ----------------------
FADKV_BENCH=$BIN PARALLEL_HOME=$W/parallel-home \
    "$SRC"/configs/slurm/parallel.sh "$W"/sweep.toml "$W"/merged 4 --quiet \
    >"$W"/parallel.out 2>&1
rc=$?
[ $rc = 0 ] || tail -n 20 "$W"/parallel.out
check "parallel.sh: 4 shards and merge (exit $rc)" test $rc = 0
check "each shard directory holds its shard's cells" sh -c "
    for i in 0 1 2 3; do
        [ \$(ls '$W'/merged.shards/s\$i/cells/*.meta | wc -l) = \
          \$(sed -n 's/^\([0-9]*\) cell(s) in this shard.*/\1/p' '$W'/dry\$i.out) ] || exit 1
    done"
"$SRC"/tools/compare_results.sh "$W"/single "$W"/merged >"$W"/cmp2.out 2>&1
check "the merged directory equals the unsharded run cell for cell" test $? = 0

# ---- teardown ---------------------------------------------------------------------------
pids="${daemons[*]}"
teardown
left=''
for p in $pids; do alive "$p" && left="$left $p"; done
check "the cluster is torn down (no daemon left)" test -z "$left"
check "no process left with a file in the test's directory" test -z "$(ours)"

echo "test_slurm: $(elapsed) s in all"
echo "$fails failure(s)"
[ "$fails" = 0 ]
