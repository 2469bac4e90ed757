# SPDX-License-Identifier: MIT
# Fig. 3b: relative reconstruction error of vectors encoded at each decode step, in bins of
# `bin` steps (64; fewer for short traces: at least 8 bins) (mean over K/V streams and layers, then sequences; bars: 95% bootstrap over
# sequences). data: one block per codec; columns: bin_start bin_centre mean lo hi.
load plotdir.'/common.gp'
set title ttl('Reconstruction error during decoding')
if (!exists("bin")) bin = 64
set xlabel sprintf('decode step (bins of %d steps)', bin)
set ylabel 'relative error ||x - x̂|| / ||x||'
set xrange [0:*]
set yrange [0:*]
# nseq > 0: blocks with too few sequences for an interval have no error bars; their
# sequences (columns 6..) are drawn as open circles
if (!exists("nseq")) nseq = 0
lo(c, m) = valid(c) ? column(c) : column(m)    # no interval: a bar of length 0
# (an empty `for` still runs its clause once: the sequence clauses only when there are some)
plot_seq = nseq > 0 ? ", for [i=1:words(codecs)] for [j=1:nseq] data index (i-1) u 2:(column(5+j)) w points pt 6 ps 0.8 lt cstyle(word(codecs,i)) notitle" : ''
eval "plot for [i=1:words(codecs)] data index (i-1) u 2:3:(lo(4,3)):(lo(5,3)) w yerrorlines \
         lt cstyle(word(codecs,i)) title ctitle(word(codecs,i))".plot_seq
