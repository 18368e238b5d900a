#!/usr/bin/env bash
# The Python package's HF callback: overhead per step and the time from a staged change to the first
# step that runs with it, against the real daemon (python/bench/bench.py). Needs what ./scripts/test.sh
# sets up (the venv with the package installed, the memwatch binary, the fake NVML).
# PAIRS=20 LATENCY=5 by default.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MEMWATCH_VENV:-$PWD/.venv}
cargo build --quiet --locked -p memwatch -p memwatch-fake-nvml
"$venv/bin/pip" install -q --no-deps --force-reinstall ./python
exec "$venv/bin/python" python/bench/bench.py
