# SPDX-License-Identifier: MIT
# Memory vs attention fidelity: bytes per token vs attention KL (log) of every cell, one
# marker per codec, and the Pareto front (dashed). data: one block per codec (order of
# `codecs`), then the front; columns: bytes_per_token attn_kl rel_err "label" cell label_y;
# each point labelled by the options that tell its codec's cells apart, at label_y (the
# exporter moves a label off the labels before it).
load plotdir.'/common.gp'
set title ttl('KV memory vs attention fidelity')
set logscale y
set xlabel 'KV memory per token (bytes; codes + buffer + appended atoms)'
set ylabel 'attention KL(P_{ref} || P_{comp}) (nats, log scale)'
set ytics ()
set for [e=-6:3] ytics add (sprintf('%g', 10.0**e) 10.0**e, sprintf('%g', 2*10.0**e) 2*10.0**e, sprintf('%g', 5*10.0**e) 5*10.0**e)
set mytics 10
plot for [i=1:words(codecs)] data index (i-1) u 1:2 w points lt cstyle(word(codecs,i)) \
         title ctitle(word(codecs,i)), \
     for [i=1:words(codecs)] data index (i-1) u 1:6:4 w labels left offset char 0.7, 0 \
         font ',9' tc lt cstyle(word(codecs,i)) noenhanced notitle, \
     data index words(codecs) u 1:2 w steps dt 2 lw 1.5 lc rgb '#555555' title 'Pareto front'
