# SPDX-License-Identifier: MIT
# Fig. 1d: Jaccard overlap of the after-prefill inactive atom sets between prompts (mean over
# prompt pairs, layers and K/V), one bar per codec. data: index style overlap ... label cell.
load plotdir.'/common.gp'
set title ttl('Inactive capacity shared across prompts')
set style fill solid 0.85 border rgb '#333333'
set boxwidth 0.6
set yrange [0:1.1]
set xrange [-0.6:*]
set ylabel 'Jaccard overlap of inactive sets'
set xlabel 'codec (representative cell)'
set grid noxtics
unset key
plot data u 1:3:2:xtic(6) w boxes lc variable, \
     ''   u 1:3:(sprintf('%.2f', $3)) w labels offset 0,0.8
