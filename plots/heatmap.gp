# SPDX-License-Identifier: MIT
# Three heatmap panels of a grid of cells: relative error at encode time (the headline
# rel_err_mean), relative error of every stored row re-reconstructed with the final
# dictionary (rel_err_final_mean: differs when FAD-KV replaces atoms still in use, tau_c > 0),
# and attention KL. Loaded by fig3c and fig3d. Needs data, nx, ny, xtitle, ytitle, main.
# data: xi yi rel_err attn_kl xlabel ylabel rel_err_text attn_kl_text final final_text cell
# (one block per y value; "NaN" / "n/a" for a missing cell).
set xrange [-0.5:nx-0.5]
set yrange [-0.5:ny-0.5]
set xtics noenhanced
set ytics noenhanced
unset grid
set tics scale 0
set border 15
set xlabel xtitle
set ylabel ytitle
set cbtics scale 0.5
set multiplot layout 1,3 title ttl(main) margins 0.075, 0.925, 0.15, 0.82 spacing 0.085, 0
set title 'relative error (encode time)'
plot data u 1:2:(0.5):(0.5):3:xtic(5):ytic(6) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:7 w labels boxed notitle
set title 'relative error (final dictionary)'
unset ylabel
unset ytics
plot data u 1:2:(0.5):(0.5):9:xtic(5) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:10 w labels boxed notitle
set title 'attention KL(P_{ref} || P_{comp}) (nats)'
plot data u 1:2:(0.5):(0.5):4:xtic(5) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:8 w labels boxed notitle
unset multiplot
