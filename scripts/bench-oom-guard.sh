#!/usr/bin/env bash
# What the Python package's out-of-memory guard (AdaptiveLoader.backward) costs a step when nothing
# fails, against a plain loop, side by side: one process, and two DDP ranks over gloo, where the guard
# adds one small all-reduce a micro-batch (python/bench/oom_guard.py). Needs the venv that
# ./scripts/test.sh sets up. ROUNDS=15 STEPS=20 by default; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MEMWATCH_VENV:-$PWD/.venv}
"$venv/bin/pip" install -q --no-deps --force-reinstall ./python
exec "$venv/bin/python" python/bench/oom_guard.py
