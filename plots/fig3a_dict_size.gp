# SPDX-License-Identifier: MIT
# Fig. 3a: normalised dictionary size N_t/N vs decode step, one line per codec (mean over
# layers, K/V and sequences; band: 95% bootstrap over sequences). data: one block per codec
# in the order of `codecs`; columns: step mean lo hi. Markers every nsteps/8 steps, staggered per
# codec so that coinciding lines (Lexico and FAD-KV stay at 1) remain distinguishable.
load plotdir.'/common.gp'
set title ttl('Dictionary size during decoding')
set xlabel 'decode step'
set ylabel 'normalised dictionary size N_t / N'
set autoscale xfix
set offsets 0, 0, graph 0.03, graph 0.03
nc = words(codecs)
if (!exists("nsteps")) nsteps = 512
# nseq > 0: blocks with too few sequences for an interval have no band; their sequences
# (columns 5..) are drawn as thin lines
if (!exists("nseq")) nseq = 0
mi = nsteps >= 16 ? int(nsteps / 8) : 1    # marker interval: about 8 markers per line
lo(c, m) = valid(c) ? column(c) : column(m)    # no interval: an empty band at the mean
# (an empty `for` still runs its clause once: the sequence clauses only when there are some)
plot_seq = nseq > 0 ? ", for [i=1:nc] for [j=1:nseq] data index (i-1) u 1:(column(4+j)) w lines lw 0.6 lt cstyle(word(codecs,i)) notitle" : ''
eval "plot for [i=1:nc] data index (i-1) u 1:(lo(3,2)):(lo(4,2)) w filledcurves \
         fs transparent solid 0.15 noborder lt cstyle(word(codecs,i)) notitle, \
     for [i=1:nc] data index (i-1) u 1:2 w lines lt cstyle(word(codecs,i)) notitle, \
     for [i=1:nc] data index (i-1) every mi::int(mi * i / (nc + 1)) u 1:2 w points \
         lt cstyle(word(codecs,i)) notitle, \
     for [i=1:nc] NaN w linespoints lt cstyle(word(codecs,i)) title ctitle(word(codecs,i))".plot_seq

