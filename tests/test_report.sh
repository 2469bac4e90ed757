#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The HTML report (harness/report/fk_report.h): a small sweep on the embedded traces, `plot`,
# then figures/report.html is one self-contained page (every drawn PNG embedded, no network
# reference), opened in headless Chromium (Debian's chromium package): its self-check must
# title it "OK, N figures" with N the PNGs drawn, and a copy with one figure's bytes broken
# must title itself ERROR (the check can fail). A screenshot is kept in $FK_REPORT_SHOT
# (default: report-screenshot.png in the working directory).
#   test_report.sh BIN         (FK_SRCDIR = the source tree)
set -uo pipefail
BIN=$(realpath "$1")
SRC=${FK_SRCDIR:?FK_SRCDIR must name the source tree}
SHOT=${FK_REPORT_SHOT:-$PWD/report-screenshot.png}
W=$(mktemp -d /tmp/fk-report-XXXXXX)
trap 'rm -rf "$W"' EXIT
fails=0
check() { local what=$1; shift; if "$@"; then echo "PASS  $what"; else echo "FAIL  $what"; fails=$((fails + 1)); fi; }

cat >"$W/sweep.toml" <<EOF
[sweep]
name = "report"
output = "$W/res"
attention = true
attn_stride = 4
[[dataset]]
name = "fortune"
traces = ["$SRC/datasets/embedded/fortune-byte-4L-*.h5"]
dictionary = "$SRC/datasets/dicts/fortune-byte-4L.h5"
defaults = { n_b = 16, n = 32 }
[[codec]]
name = "full"
[[codec]]
name = "lexico"
grid = { s = [4, 8] }
[[codec]]
name = "kivi"
group = 16
residual = 16
grid = { bits = [2, 4] }
EOF
"$BIN" --config "$W/sweep.toml" --quiet >"$W/run.out" 2>&1
check "the sweep runs" test -f "$W/res/cells.csv"
(cd "$SRC" && "$BIN" plot "$W/res" --format png) >"$W/plot.out" 2>&1
R=$W/res/figures/report.html
check "plot writes report.html" test -s "$R"
n_png=$(ls "$W"/res/figures/*.png 2>/dev/null | wc -l)
n_img=$(grep -o 'data:image/png;base64,' "$R" | wc -l)
check "every drawn PNG is embedded ($n_img of $n_png)" test "$n_img" = "$n_png" -a "$n_png" -gt 0
check "self-contained: no network or file reference" \
    bash -c "! grep -qE '(src|href)=\"(https?:|file:|//)' '$R'"
check "the cells table lists every cell" \
    test "$(grep -o '<tr><td>' "$R" | wc -l)" -ge "$(($(wc -l <"$W/res/cells.csv") - 1))"
# the cells table's columns grouped as the metric table groups them, definitions in tooltips
groups=$(grep -o '<tr class="groups">.*</tr><tr>' "$R" | grep -o '<th colspan="[0-9]*">[a-z ]*</th>' |
         sed 's/<[^>]*>//g' | tr '\n' ',')
check "the cells table's column groups: $groups" \
    bash -c "[[ '$groups' == cell,error,attention,memory,cost,dictionary,* ]]"
check "identity and options every cell shares are said once, above the table" \
    grep -q 'every cell has <span id="common">[^<]*status = ok' "$R"
check "a metric's header carries its definition" \
    grep -q '<th title="cosine of the exact and the compressed attention output[^"]*(higher is better)">attn_cos</th>' "$R"
# a table of contents naming every drawn figure, and a caption saying what each shows
n_toc=$(grep -o '<li><a href="#fig-' "$R" | wc -l)
check "the contents list every drawn figure ($n_toc of $n_png)" test "$n_toc" = "$n_png"
n_cap=$(grep -o '<figcaption><b>[^<]*</b>\. [A-Z][^<]\{20,\}</figcaption>' "$R" | wc -l)
check "every figure has a caption ($n_cap of $n_png)" test "$n_cap" = "$n_png"
check "a caption names the paper figure it reproduces" grep -q 'Paper Fig. 1a' "$R"
check "the budget table's budgets and tolerance are shown" \
    grep -q '<p>Budgets, bits per element: .*1.10 x the budget.</p>' "$R"
check "the equal-budget table and the provenance are there" \
    bash -c "grep -q 'Equal-budget tables' '$R' && grep -q 'Provenance' '$R'"

chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chrome" ]; then
    echo "SKIP  headless rendering: no chromium (./setup.sh test installs Debian's chromium)"
    echo "$fails failure(s)"
    [ "$fails" = 0 ] && exit 77 || exit 1
fi
render() {  # FILE -> the page title after load, from the DOM
    timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --virtual-time-budget=10000 \
        --user-data-dir="$W/profile" --dump-dom "file://$1" 2>"$W/chrome.err" |
        sed -n 's:.*<title>\(.*\)</title>.*:\1:p' | head -1
}
title=$(render "$R")
check "it renders and checks itself: '$title'" test "$title" = "fadkv-bench report: OK, $n_png figures"
timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --user-data-dir="$W/profile" \
    --window-size=1280,1600 --screenshot="$SHOT" "file://$R" >/dev/null 2>&1
check "a screenshot is kept ($SHOT)" test -s "$SHOT"
# the self-check can fail: one figure's PNG bytes broken
sed '0,/data:image\/png;base64,iVBOR/s//data:image\/png;base64,AAAAA/' "$R" >"$W/broken.html"
title=$(render "$W/broken.html")
check "a broken figure makes it say ERROR: '$title'" \
    bash -c "[[ '$title' == 'fadkv-bench report: ERROR, 1 figure(s) not decoded'* ]]"
echo "$fails failure(s)"
[ "$fails" = 0 ]
