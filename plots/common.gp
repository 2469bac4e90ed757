# SPDX-License-Identifier: MIT
# Shared setup of every figure script: terminal from fmt (png | pdf | svg), output file,
# axes, and the fixed codec map (same colour and marker in every figure).
# Variables set by `fadkv-bench plot` with -e: data, out, fmt, plotdir, subtitle, ...
if (!exists("fmt")) fmt = 'png'
if (!exists("subtitle")) subtitle = ''
if (!exists("wide")) wide = 0
if (fmt eq 'pdf') {
    if (wide) { set terminal pdfcairo enhanced color size 10.0in,3.4in font 'Helvetica,9' } \
    else { set terminal pdfcairo enhanced color size 5.0in,3.4in font 'Helvetica,9' }
} else {
    if (fmt eq 'svg') {
        if (wide) { set terminal svg enhanced size 1800,600 font 'Helvetica,14' background rgb 'white' } \
        else { set terminal svg enhanced size 900,610 font 'Helvetica,14' background rgb 'white' }
    } else {
        if (wide) { set terminal pngcairo enhanced color size 2000,680 font 'Helvetica,15' } \
        else { set terminal pngcairo enhanced color size 1000,680 font 'Helvetica,15' }
    }
}
set output out
set encoding utf8
set border 3 lw 1.2
set tics nomirror out scale 0.8
set grid back lc rgb '#e0e0e0' lw 1 dt 1
set key outside right top vertical Left reverse samplen 2.5 spacing 1.3 width 1 noenhanced
set datafile missing 'NaN'

# Codec map, one colour per built-in codec (Okabe-Ito and Tol colours, distinguishable in
# colour-blind vision) and its family by the marker: filled for the dictionary codecs, open
# for the quantisers, low rank and the rest. Linetypes 1..16 = the registry's order (full,
# lexico, lexico-adp, gm, pl, fadkv, topk, uniform, kivi, quant, pca, external, engine, rotq,
# gear),
# then every other codec (plugins, codec+policy) in grey: FK_PLOT_STYLES of
# report/fk_plotdata.h.
set linetype 1  lc rgb '#000000' lw 2 pt 1  ps 1.6 dt 1
set linetype 2  lc rgb '#0072B2' lw 2 pt 5  ps 1.3 dt 1
set linetype 3  lc rgb '#56B4E9' lw 2 pt 7  ps 1.4 dt 1
set linetype 4  lc rgb '#009E73' lw 2 pt 9  ps 1.6 dt 1
set linetype 5  lc rgb '#D55E00' lw 2 pt 11 ps 1.6 dt 1
set linetype 6  lc rgb '#CC79A7' lw 2 pt 13 ps 1.6 dt 1
set linetype 7  lc rgb '#8C510A' lw 2 pt 2  ps 1.5 dt 1
set linetype 8  lc rgb '#E69F00' lw 2 pt 4  ps 1.4 dt 1
set linetype 9  lc rgb '#AA7700' lw 2 pt 6  ps 1.4 dt 1
set linetype 10 lc rgb '#882255' lw 2 pt 8  ps 1.5 dt 1
set linetype 11 lc rgb '#117733' lw 2 pt 10 ps 1.5 dt 1
set linetype 12 lc rgb '#332288' lw 2 pt 12 ps 1.5 dt 1
set linetype 13 lc rgb '#44AA99' lw 2 pt 14 ps 1.5 dt 1
set linetype 14 lc rgb '#DDCC77' lw 2 pt 15 ps 1.6 dt 1
set linetype 15 lc rgb '#AA4499' lw 2 pt 16 ps 1.4 dt 1
set linetype 16 lc rgb '#777777' lw 2 pt 3  ps 1.4 dt 1
cstyle(c) = c eq 'full' ? 1 : c eq 'lexico' ? 2 : c eq 'lexico-adp' ? 3 : c eq 'gm' ? 4 : \
            c eq 'pl' ? 5 : c eq 'fadkv' ? 6 : c eq 'topk' ? 7 : c eq 'uniform' ? 8 : \
            c eq 'kivi' ? 9 : c eq 'quant' ? 10 : c eq 'pca' ? 11 : c eq 'external' ? 12 : \
            c eq 'engine' ? 13 : c eq 'rotq' ? 14 : c eq 'gear' ? 15 : 16
ctitle(c) = c eq 'full' ? 'Full KV' : c eq 'lexico' ? 'Lexico' : c eq 'lexico-adp' ? \
            'Lexico-ADP' : c eq 'gm' ? 'GM' : c eq 'pl' ? 'PL' : c eq 'fadkv' ? 'FAD-KV' : c
# Keys and values (Fig. 1): styles 11 and 12.
set style line 11 lc rgb '#0072B2' lw 2 pt 5 ps 1.2 dt 1
set style line 12 lc rgb '#D55E00' lw 2 pt 7 ps 1.2 dt 2
# Heatmaps: viridis.
set palette defined (0 '#440154', 0.25 '#3b528b', 0.5 '#21918c', 0.75 '#5ec962', 1 '#fde725')
set style textbox opaque noborder margins 1,1
ttl(main) = subtitle eq '' ? main : main."\n{/*0.8 ".subtitle."}"
