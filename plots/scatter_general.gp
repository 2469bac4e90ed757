# SPDX-License-Identifier: MIT
# A metric against a metric (`fadkv-bench plot RESULTS --x METRIC --y METRIC [--by OPTION]`):
# one point per setting, one colour per --by value (per codec: the codec map of common.gp),
# each point labelled with the options that tell the settings apart, and the Pareto
# frontier as a dashed step line. data: one block per group "x y label style", the last
# block the frontier. Variables: nl, T[i] (group titles), S[i] (linetypes), logx, logy,
# xtitle, ytitle, main (title, enhanced text).
load plotdir.'/common.gp'
if (!exists("logx")) logx = 0
if (!exists("logy")) logy = 0
set title ttl(main)
set xlabel xtitle noenhanced
set ylabel ytitle noenhanced
if (logx) { set logscale x 10 }
if (logy) { set logscale y 10 }
# room around the points: none sits on an axis edge, labels stay inside
set offsets graph 0.06, graph 0.12, graph 0.08, graph 0.08
# a metric that is never negative starts at 0 (a KL of 0, the exact cache, on the axis)
if (!logy && exists("ymin0")) { set yrange [ymin0:*] }
if (!logx && exists("xmin0")) { set xrange [xmin0:*] }
set key outside below center horizontal maxrows 3 Left reverse width 2
plot for [i=1:nl] data index (i-1) u 1:2 w points lt S[i] ps 1.5 title T[i], \
     for [i=1:nl] data index (i-1) u 1:2:3 w labels left offset 0.8,0.4 font ',10' \
         tc lt S[i] noenhanced notitle, \
     data index nl u 1:2 w steps dt 2 lw 1.5 lc rgb '#444444' title 'Pareto frontier'
