set terminal png size 900,560 noenhanced
set output '/tmp/benchfull/memory.png'
set title 'chalk shim vs runsc alone (runsc version VERSION_MISSING)'
set xlabel 'memory written by the sandbox (MB)'
set ylabel 'seconds'
set key top left
set grid
plot '/tmp/benchfull/memory.dat' using 1:2 with linespoints dashtype 1 linewidth 2 title 'chalk snapshot', \
     '/tmp/benchfull/memory.dat' using 1:3 with linespoints dashtype 1 linewidth 2 title 'chalk fork', \
     '/tmp/benchfull/memory.dat' using 1:4 with linespoints dashtype 1 linewidth 2 title 'chalk resume', \
     '/tmp/benchfull/memory.dat' using 1:5 with linespoints dashtype 2 linewidth 2 title 'runsc checkpoint', \
     '/tmp/benchfull/memory.dat' using 1:6 with linespoints dashtype 2 linewidth 2 title 'runsc restore (fork)', \
     '/tmp/benchfull/memory.dat' using 1:7 with linespoints dashtype 2 linewidth 2 title 'runsc restore (resume)'
