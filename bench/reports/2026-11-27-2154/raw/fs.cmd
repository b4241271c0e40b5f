lua5.4 bench/lua/bench_fs.lua --json --dir build-release/bench-fs-data
