bash bench/lua/bench_busted.sh --build-dir build-release
