#!/usr/bin/env bash
# Installs what is missing, builds the normal configuration (build/) and
# runs the C tour of the API, examples/tour.c.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/build.sh normal
echo
exec build/examples/example_tour
