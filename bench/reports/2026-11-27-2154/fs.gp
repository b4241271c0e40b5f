set terminal pngcairo size 1744,440 font 'sans,9' noenhanced
set output '/work/wt-report/bench/reports/2026-11-27-2154/fs.png'
set label 'File I/O (bench_fs.lua, bench_io): ratio to the floor (floor = 1.0; higher is better)' at screen 0.5, screen 0.96 center font ',10'
set logscale y 2
set yrange [0.08125:7.184]
set xrange [-0.3:33]
set tmargin 6
set ylabel 'value / floor (log scale)'
set grid ytics lc rgb '#dddddd'
set xtics rotate by 30 right nomirror font ',8'
set ytics nomirror format '%.3g'
set border 3
set key off
set datafile separator '\t'
set bmargin 8
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 1.5 lc rgb '#444444' front
set label "floor.big1" at 7.00, graph 1.03 center font ',9'
set label "floor.small" at 18.50, graph 1.09 center font ',9'
set label "C: big_c_read" at 25.50, graph 1.03 center font ',9'
set label "C: small_c" at 30.50, graph 1.09 center font ',9'
plot '/work/wt-report/bench/reports/2026-11-27-2154/fs.dat' using 1:2:($1-0.4):($1+0.4):(1):2:3:xtic(4) with boxxyerror fs solid 0.85 noborder lc rgb variable, '' using 1:($2 >= 1 ? $2 * 1.12 : $2 / 1.12):(sprintf('%.2f', $2)) with labels font ',8'
