# SPDX-License-Identifier: MIT
# A metric against a swept option (`fadkv-bench plot RESULTS --x OPTION --y METRIC [--by
# OPTION]`): one line per value of --by (or per codec); a point is the mean over sequences,
# with its 95% bootstrap interval over sequences (error bar) when it has enough sequences,
# else the individual sequences are drawn as open circles in the line's colour.
# data: one block per line: "x" x_pos mean lo hi n_seq n_cells style.
# seq: x_pos value style line. Variables: nl, T[i] (titles), S[i] (linetypes), nci, nseq,
# cat (categorical x), logx, xtitle, ytitle, main (title, enhanced text).
load plotdir.'/common.gp'
if (!exists("cat")) cat = 0
if (!exists("logx")) logx = 0
set title ttl(main)
set xlabel xtitle noenhanced
set ylabel ytitle noenhanced
if (logx) { set logscale x 2 }
if (cat) { set xrange [-0.5:*] }
set offsets graph 0.03, graph 0.03, 0, 0
# the key below the plot: line titles can be long (every option that tells lines apart)
set key outside below center vertical maxrows 4 Left reverse width 2
cmd = 'plot for [i=1:nl] data index (i-1) u 2:3:xtic(1) w linespoints lt S[i] title T[i]'
if (nci > 0) { cmd = cmd.", data u 2:3:4:5:8 w yerrorbars lc variable pt 0 lw 1.5 notitle" }
if (nseq > 0) { cmd = cmd.", seq u 1:2:3 w points pt 6 ps 0.9 lc variable notitle" }
eval cmd
