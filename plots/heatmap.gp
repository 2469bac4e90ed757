# SPDX-License-Identifier: MIT
# Two heatmap panels (relative error, attention KL) of a grid of cells; loaded by fig3c and
# fig3d. data: xi yi rel_err attn_kl xlabel ylabel rel_err_text attn_kl_text cell
# (one block per y value). Needs nx, ny, xtitle, ytitle, main.
set xrange [-0.5:nx-0.5]
set yrange [-0.5:ny-0.5]
set xtics noenhanced
set ytics noenhanced
unset grid
set tics scale 0
set border 15
set xlabel xtitle
set ylabel ytitle
set multiplot layout 1,2 title ttl(main)
set title 'relative reconstruction error'
set cblabel 'rel. error'
plot data u 1:2:3:xtic(5):ytic(6) w image notitle, \
     ''   u 1:2:7 w labels boxed notitle
set title 'attention KL(P_{ref} || P_{comp})'
set cblabel 'KL (nats)'
plot data u 1:2:4:xtic(5):ytic(6) w image notitle, \
     ''   u 1:2:8 w labels boxed notitle
unset multiplot
