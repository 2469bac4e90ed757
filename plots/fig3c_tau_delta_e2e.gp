# SPDX-License-Identifier: MIT
# Fig. 3c in the loop (model datasets): the squares of fig3c_tau_delta (FAD-KV over tau_c (x)
# and delta_k/delta_v (y)) coloured by the attention KL in replay (open loop), the attention
# KL in the loop and the end-to-end next-token KL of the teacher-forced decode (closed loop).
# data: xi yi attn_kl e2e_kl loop_attn_kl xlabel ylabel attn_kl_text e2e_kl_text
# loop_attn_kl_text cell (one block per y value; "NaN" / "n/a" for a missing cell).
# Variables: data, nx, ny, subtitle.
wide = 1
load plotdir.'/common.gp'
main = 'FAD-KV sensitivity to {/Symbol t}_c and {/Symbol d}: open loop vs model in the loop'
set xrange [-0.5:nx-0.5]
set yrange [-0.5:ny-0.5]
set xtics noenhanced
set ytics noenhanced
unset grid
set tics scale 0
set border 15
set xlabel 'inactivity threshold {/Symbol t}_c (stored codes using an atom)'
set ylabel 'adaptation thresholds {/Symbol d}_k / {/Symbol d}_v'
set cbtics scale 0.5
set multiplot layout 1,3 title ttl(main) margins 0.075, 0.925, 0.15, 0.82 spacing 0.085, 0
set title 'attention KL, replay (nats)'
plot data u 1:2:(0.5):(0.5):3:xtic(6):ytic(7) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:8 w labels boxed notitle
set title 'attention KL, in the loop (nats)'
unset ylabel
unset ytics
plot data u 1:2:(0.5):(0.5):5:xtic(6) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:10 w labels boxed notitle
set title 'end-to-end next-token KL(P_{exact} || P_{codec}) (nats)'
plot data u 1:2:(0.5):(0.5):4:xtic(6) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:9 w labels boxed notitle
unset multiplot
