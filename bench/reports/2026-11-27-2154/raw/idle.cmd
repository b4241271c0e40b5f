bash bench/net/idle.sh --build-dir build-release
