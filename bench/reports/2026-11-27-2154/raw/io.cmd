build-release/bench/bench_io --dir build-release/bench-io-data
