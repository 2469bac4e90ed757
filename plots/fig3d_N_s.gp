# SPDX-License-Identifier: MIT
# Fig. 3d: sensitivity to the dictionary size N and the sparsity s: relative error and
# attention KL per cell (heatmap.gp). xtitle comes from the exporter (N, or the dataset name
# when the dictionary's atom count cannot be read).
wide = 1
load plotdir.'/common.gp'
# main, xtitle and ytitle come from the exporter when N and s do not vary together and
# the figure shows the two options that do
if (!exists("main")) main = 'Sensitivity to dictionary size N and sparsity s'
if (!exists("xtitle")) xtitle = 'dictionary atoms N'
if (!exists("ytitle")) ytitle = 'sparsity s (atoms per vector)'
load plotdir.'/heatmap.gp'
