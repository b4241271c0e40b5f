build-release/bench/bench_preempt --reps=5
