bash bench/net/http.sh --build-dir build-release
