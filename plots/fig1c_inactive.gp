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
if (!exists("nseq")) nseq = 0
if (nseq == 0) {
    plot data u 2:3:4:xtic(1) lc rgb '#0072B2' title 'keys (K)', \
         ''   u 5:6:7 lc rgb '#D55E00' title 'values (V)'
} else {
    # too few sequences for an interval: bars of the mean, the sequences (columns 8.. for
    # K, 8+nseq.. for V) as open circles over their bar (a cluster of 2 bars, gap 1.5)
    set style histogram clustered gap 1.5
    off = 0.5 / 3.5
    plot data u 2:xtic(1) lc rgb '#0072B2' title 'keys (K)', \
         ''   u 5 lc rgb '#D55E00' title 'values (V)', \
         for [j=1:nseq] '' u ($0 - off):(column(7+j)) w points pt 6 ps 1.2 lc rgb '#000000' \
             title (j == 1 ? sprintf('each of the %d sequences', nseq) : ''), \
         for [j=1:nseq] '' u ($0 + off):(column(7+nseq+j)) w points pt 6 ps 1.2 \
             lc rgb '#000000' notitle
}
