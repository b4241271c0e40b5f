build-release/bench/bench_core --json
