# SPDX-License-Identifier: MIT
# Fig. 3c: sensitivity of FAD-KV to the inactivity threshold tau_c and the adaptation
# thresholds delta_k / delta_v: relative error and attention KL per cell (heatmap.gp).
wide = 1
load plotdir.'/common.gp'
main = 'FAD-KV sensitivity to {/Symbol t}_c and {/Symbol d}'
xtitle = 'inactivity threshold {/Symbol t}_c (stored codes using an atom)'
ytitle = 'adaptation thresholds {/Symbol d}_k / {/Symbol d}_v'
load plotdir.'/heatmap.gp'
