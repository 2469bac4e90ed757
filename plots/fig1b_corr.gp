# SPDX-License-Identifier: MIT
# Fig. 1b: sorted |D^T x| normalised by its maximum vs rank, mean over streams (lines) and the
# 10-90% quantile band over streams. data: rank K_mean K_p10 K_p90 V_mean V_p10 V_p90.
load plotdir.'/common.gp'
set title ttl('Correlation profile of KV vectors with the dictionary')
set logscale x 2
# x axis up to the profile's length (nrank: min(256, live atoms), no padding drawn)
if (!exists("nrank")) nrank = 256
set xrange [1:nrank * 1.17]
set xtics ('1' 1, '4' 4, '16' 16, '64' 64, '256' 256)
set yrange [0:1.05]
set xlabel 'rank of |d_j^T x| (log_2 scale)'
set ylabel '|d_j^T x| / max_j |d_j^T x|'
plot data u 1:3:4 w filledcurves fs transparent solid 0.2 noborder lc rgb '#0072B2' \
         title 'K 10-90%', \
     ''   u 1:6:7 w filledcurves fs transparent solid 0.2 noborder lc rgb '#D55E00' \
         title 'V 10-90%', \
     ''   u 1:2 w lines ls 11 title 'keys (K), mean', \
     ''   u 1:5 w lines ls 12 title 'values (V), mean'
