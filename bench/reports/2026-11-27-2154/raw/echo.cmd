bash bench/net/run.sh --build-dir build-release
