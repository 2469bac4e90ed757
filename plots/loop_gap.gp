# SPDX-License-Identifier: MIT
# Open loop vs closed loop: each cell's attention KL in replay (x: recorded queries on a
# compressed copy of the exact cache) against the same codec's attention KL in the loop (y:
# the model decodes from the compressed cache, so the error reaches later layers and tokens),
# log-log; the diagonal y = x (dashed): points above it are what the replay proxy
# understates. data: one block per codec (order of `codecs`); columns: attn_kl loop_attn_kl
# bits_per_elem "label" codec cell. Variables: codecs, cfam (colour: family), cpt (marker),
# lo, hi (axis range).
load plotdir.'/common.gp'
fcolors = '#000000 #0072B2 #E69F00 #009E73 #D55E00 #CC79A7 #56B4E9 #F0E442'
fc(i) = i < 1 ? '#777777' : word(fcolors, (i - 1) % words(fcolors) + 1)
fmarks = '7 5 9 11 13 15 3 1 2'
fp(i) = int(word(fmarks, (i - 1) % words(fmarks) + 1))
set title ttl('attention KL: open loop (replay) vs closed loop (model in the loop)')
set xlabel 'open loop: attention KL in replay (nats, log scale)'
set ylabel 'closed loop: attention KL in the loop (nats, log scale)'
set logscale xy
set format x '%g'
set format y '%g'
set xrange [lo:hi]
set yrange [lo:hi]
nc = words(codecs)
plot x w lines dt 2 lw 1.5 lc rgb '#555555' title 'y = x (no propagation)', \
     for [i=1:nc] data index (i-1) u 1:2 w points pt fp(int(word(cpt,i))) ps 1.5 \
         lc rgb fc(int(word(cfam,i))) title ctitle(word(codecs,i)), \
     for [i=1:nc] data index (i-1) u 1:2:4 w labels left offset char 0.7, char 0.45 \
         font ',9' tc rgb fc(int(word(cfam,i))) noenhanced notitle
