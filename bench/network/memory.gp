set terminal png size 900,560 noenhanced
set output 'bench/network/memory.png'
set title 'chalk shim vs runsc alone (runsc version 0.0~20221219.0)'
set xlabel 'memory written by the sandbox (MB)'
set ylabel 'seconds'
set key top left
set grid
plot 'bench/network/memory.dat' using 1:2 with linespoints dashtype 1 linewidth 2 title 'chalk snapshot', \
     'bench/network/memory.dat' using 1:3 with linespoints dashtype 1 linewidth 2 title 'chalk fork', \
     'bench/network/memory.dat' using 1:4 with linespoints dashtype 1 linewidth 2 title 'chalk resume', \
     'bench/network/memory.dat' using 1:5 with linespoints dashtype 2 linewidth 2 title 'runsc checkpoint', \
     'bench/network/memory.dat' using 1:6 with linespoints dashtype 2 linewidth 2 title 'runsc restore (fork)', \
     'bench/network/memory.dat' using 1:7 with linespoints dashtype 2 linewidth 2 title 'runsc restore (resume)'
