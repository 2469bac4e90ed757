# SPDX-License-Identifier: MIT
# Cross-family Pareto: bytes per token per KV head (K and V together, mean over layers, end
# of the trace; top axis: bits per element) vs one fidelity metric of every finished cell of
# a dataset, one series per codec (colour and marker: the codec map of common.gp, filled
# markers for the dictionary codecs; the key names the family),
# each point labelled with its setting; the Pareto frontier (dashed steps) and the fp16
# level (dotted). data: one block per codec (order of `codecs`), then the frontier; columns:
# bytes_tok_head y bits_per_elem "label" codec cell.
# Variables: metric (cos | kl | err | rkl | mass | e2e: closed-loop next-token KL), logy, fp16 (bytes; 0 = unknown), xmax, codecs, cfam
# (colour index of each block: the family's registry position, 0 = unknown), cpt (marker
# index), cfamname (family of each block).
load plotdir.'/common.gp'
if (!exists("metric")) metric = 'cos'
if (!exists("logy")) logy = 0
if (!exists("fp16")) fp16 = 0
if (!exists("xmax")) xmax = 0
ylab = metric eq 'e2e' ? 'end-to-end next-token KL (closed loop, nats, log scale)' : \
       metric eq 'kl' ? 'attention KL(P || P_{comp}) (nats, log scale)' : \
       metric eq 'err' ? 'relative reconstruction error (log scale)' : \
       metric eq 'rkl' ? 'attention KL(P_{comp} || P) (nats, log scale)' : \
       metric eq 'mass' ? 'exact attention mass on the retained keys' : \
       'attention-output cosine'
what = metric eq 'e2e' ? 'end-to-end KL' : metric eq 'kl' ? 'attention KL' : metric eq 'err' ? 'reconstruction error' : \
       metric eq 'rkl' ? 'reverse attention KL' : metric eq 'mass' ? 'retained attention mass' : \
       'attention-output cosine'
set title ttl('KV memory per token per head vs '.what.', all codecs')
set xlabel 'bytes per token per KV head (K + V, all a sequence holds)'
set ylabel ylab
if (logy) { set logscale y; set format y '%g' }
if (xmax > 0) { set xrange [0:xmax] }
# no point on the top or bottom edge
if (logy) { set offsets 0, 0, graph 0.06, graph 0.06 } else { set offsets 0, 0, graph 0.05, graph 0.05 }
if (fp16 > 0) {
    set link x2 via x * 16.0 / fp16 inverse x * fp16 / 16.0
    set x2tics nomirror out (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    set x2label 'bits per element (16 = fp16)'
    set arrow 1 from fp16, graph 0 to fp16, graph 1 nohead dt 3 lw 1.5 lc rgb '#000000' back
    set label 1 'fp16' at fp16, graph 0.04 right offset -0.5, 0 font ',10'
}
set bmargin 6
set label 2 (metric eq 'e2e' ? 'closed loop: the model decodes from the compressed cache (teacher-forced on its exact greedy decode)' : \
    'teacher-forced replay: recorded queries, per-layer error, no propagation across layers or decode steps') \
    at screen 0.01, screen 0.02 left font ',9' noenhanced tc rgb '#555555'
nc = words(codecs)
plot for [i=1:nc] data index (i-1) u 1:2 w points lt cstyle(word(codecs,i)) ps 1.5 \
         title ctitle(word(codecs,i)).' ['.word(cfamname,i).']', \
     for [i=1:nc] data index (i-1) u 1:2:4 w labels left offset char 0.7, char 0.45 \
         font ',9' tc lt cstyle(word(codecs,i)) noenhanced notitle, \
     data index nc u 1:2 w steps dt 2 lw 1.5 lc rgb '#555555' title 'Pareto frontier'
