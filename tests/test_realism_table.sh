#!/bin/sh
# SPDX-License-Identifier: MIT
# tools/realism_table.sh on a hand-made cells.csv: it picks, per dataset, the first lexico,
# lexico-adp and fadkv (delta 0.3/0.42, tau_c 0 and 4) cells, reads the recall at the
# fadkv cell's pool size, computes KL(tau 4)/KL(tau 0), skips failed cells, and refuses a
# cells.csv without a column it needs.
set -eu
tool=$1
d=$(mktemp -d /tmp/fk-realism-XXXXXX)
trap 'rm -rf "$d"' EXIT
h=cell_id,codec,dataset,status,n,s,delta_k,delta_v,tau_c,rel_err_mean,attn_kl,pool_recall_8,pool_recall_256,inactive_after_prefill,inactive_overlap,dict_size_norm_final
cat >"$d/cells.csv" <<CSV
$h
a,lexico,real,ok,,8,,,,0.16,0.0127,0.1,0.2,0.82,0.74,1
b,lexico,real,ok,,16,,,,0.87,0.0045,0.1,0.2,0.70,0.63,1
c,lexico-adp,real,ok,,8,0.5,0.7,,0.16,0.0126,0.1,0.2,0.82,0.74,1.00012
e,fadkv,real,ok,256,8,0.5,0.7,0,0.25,0.03,0.1,0.27,0.8,0.8,1
f,fadkv,real,ok,256,8,0.3,0.42,0,0.196,0.0130,0.1,0.27,0.8,0.8,1
g,fadkv,real,ok,256,8,0.3,0.42,4,0.190,0.0065,0.1,0.27,0.8,0.8,1
h,fadkv,syn,failed,8,8,0.3,0.42,0,,,,,,,
i,fadkv,syn,ok,8,8,0.3,0.42,4,0.5,2.0,0.61,0.9,0.5,0.4,1
CSV
out=$(bash "$tool" "$d")
echo "$out"
real=$(echo "$out" | grep '^| real ')
want='| real | 0.160 | 0.196 | 0.27 (n 256) | 0.82 | 0.74 | 1.0001 | 0.0127 | 0.0130 | 0.0065 | 0.50 |'
[ "$real" = "$want" ] || { echo "FAIL: row real is"; echo "$real"; echo "expected"; echo "$want"; exit 1; }
syn=$(echo "$out" | grep '^| syn ')
want='| syn | - | - | - (n -) | - | - | - | - | - | 2.0000 | - |'
[ "$syn" = "$want" ] || { echo "FAIL: row syn is"; echo "$syn"; echo "expected"; echo "$want"; exit 1; }
[ -f "$d/realism.md" ] || { echo "FAIL: no realism.md"; exit 1; }
cut -d, -f1-12 "$d/cells.csv" >"$d/x.csv" && mv "$d/x.csv" "$d/cells.csv"
if bash "$tool" "$d" >/dev/null 2>"$d/err"; then echo "FAIL: accepted a cells.csv without pool_recall_256 etc."; exit 1; fi
grep -q "lacks column" "$d/err" || { echo "FAIL: message"; cat "$d/err"; exit 1; }
echo "ok"
