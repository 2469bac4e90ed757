# SPDX-License-Identifier: MIT
# Fig. 1a: recall of the full-OMP support inside the top-n screened pool vs n (log2), K and V.
# data columns: n K_mean K_lo K_hi V_mean V_lo V_hi (band: 95% bootstrap over sequences).
load plotdir.'/common.gp'
set title ttl('Screened-pool recall of full-OMP atoms')
set logscale x 2
set xrange [6:1400]
set xtics ('8' 8, '16' 16, '32' 32, '64' 64, '128' 128, '256' 256, '512' 512, '1024' 1024)
set yrange [0:1.05]
set xlabel 'candidate pool size n (atoms, log_2 scale)'
set ylabel 'recall at n (fraction of full-OMP atoms in the pool)'
plot data u 1:3:4 w filledcurves fs transparent solid 0.2 noborder lc rgb '#0072B2' notitle, \
     ''   u 1:6:7 w filledcurves fs transparent solid 0.2 noborder lc rgb '#D55E00' notitle, \
     ''   u 1:2 w linespoints ls 11 title 'keys (K)', \
     ''   u 1:5 w linespoints ls 12 title 'values (V)'
