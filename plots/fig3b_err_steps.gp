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
plot for [i=1:words(codecs)] data index (i-1) u 2:3:4:5 w yerrorlines \
         lt cstyle(word(codecs,i)) title ctitle(word(codecs,i))
