bash bench/lua/run.sh --build-dir build-release
