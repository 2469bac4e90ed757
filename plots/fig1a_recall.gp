# SPDX-License-Identifier: MIT
# Fig. 1a: recall of the full-OMP support inside the top-n screened pool vs n (log2), K and V.
# data columns: n K_mean K_lo K_hi V_mean V_lo V_hi (band: 95% bootstrap over sequences,
# with >= 5 sequences) [K_seq... V_seq...].
load plotdir.'/common.gp'
set title ttl('Screened-pool recall of full-OMP atoms')
set logscale x 2
# x axis up to the largest pool size drawn (nmax: at most the dictionary's N)
if (!exists("nmax")) nmax = 1024
set xrange [6:nmax * 1.35]
set xtics ('8' 8, '16' 16, '32' 32, '64' 64, '128' 128, '256' 256, '512' 512, '1024' 1024)
set yrange [0:1.05]
set xlabel 'candidate pool size n (atoms, log_2 scale)'
set ylabel 'recall at n (fraction of full-OMP atoms in the pool)'
# nseq > 0: too few sequences for an interval (lo, hi NaN: no band); the sequences are
# columns 8.. (K) and 8+nseq.. (V), drawn as open circles
if (!exists("nseq")) nseq = 0
lo(c, m) = valid(c) ? column(c) : column(m)    # no interval: an empty band at the mean
plot_seq = nseq > 0 ? ", for [j=1:nseq] '' u 1:(column(7+j)) w points pt 6 ps 1 lc rgb '#0072B2' title (j == 1 ? sprintf('each of the %d sequences', nseq) : ''), for [j=1:nseq] '' u 1:(column(7+nseq+j)) w points pt 6 ps 1 lc rgb '#D55E00' notitle" : ''
# (an empty `for` still runs its clause once: the sequence clauses only when there are some)
eval "plot data u 1:(lo(3,2)):(lo(4,2)) w filledcurves fs transparent solid 0.2 noborder lc rgb '#0072B2' notitle, \
     ''   u 1:(lo(6,5)):(lo(7,5)) w filledcurves fs transparent solid 0.2 noborder lc rgb '#D55E00' notitle, \
     ''   u 1:2 w linespoints ls 11 title 'keys (K)', \
     ''   u 1:5 w linespoints ls 12 title 'values (V)'".plot_seq
