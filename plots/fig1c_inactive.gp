# SPDX-License-Identifier: MIT
# Fig. 1c: fraction of dictionary atoms unused after prefill, per layer, K and V, with 95%
# bootstrap intervals over sequences. data: layer K_mean K_lo K_hi V_mean V_lo V_hi.
load plotdir.'/common.gp'
set title ttl('Inactive atoms after prefill')
set style data histogram
set style histogram errorbars gap 1.5 lw 1.2
set style fill solid 0.85 border rgb '#333333'
set yrange [0:*]
set offsets 0, 0, graph 0.05, 0
set key outside right top vertical
set xlabel 'layer'
set ylabel 'fraction of atoms unused after prefill'
set grid noxtics
plot data u 2:3:4:xtic(1) lc rgb '#0072B2' title 'keys (K)', \
     ''   u 5:6:7 lc rgb '#D55E00' title 'values (V)'
