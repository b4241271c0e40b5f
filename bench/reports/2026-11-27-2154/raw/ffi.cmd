lua5.4 bench/lua/bench_ffi.lua --reps 5
