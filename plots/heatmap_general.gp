# SPDX-License-Identifier: MIT
# A metric over two swept options (`fadkv-bench plot RESULTS --heatmap X,Y --z METRIC`): one
# square per setting, coloured and labelled by the mean over sequences ("n/a": no cell).
# data: xi yi z "xlabel" "ylabel" "ztext" n_seq n_cells, one block per y value.
# Variables: nx, ny, xtitle, ytitle, ztitle, main (title, enhanced text).
load plotdir.'/common.gp'
set title ttl(main)
set xrange [-0.5:nx-0.5]
set yrange [-0.5:ny-0.5]
set xtics noenhanced
set ytics noenhanced
unset grid
set tics scale 0
set border 15
set xlabel xtitle noenhanced
set ylabel ytitle noenhanced
set cblabel ztitle noenhanced
set key off
plot data u 1:2:(0.5):(0.5):3:xtic(4):ytic(5) w boxxyerror fs solid 1 noborder lc palette notitle, \
     ''   u 1:2:6 w labels boxed notitle
