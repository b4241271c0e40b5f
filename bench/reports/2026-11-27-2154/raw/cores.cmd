lua5.4 bench/lua/bench_cores.lua --json
