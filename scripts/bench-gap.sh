#!/usr/bin/env bash
# The gap between a daemon's death and its successor, on this machine's cgroup v1, side by side: a hog
# paused at its line in a real memory cgroup, resumed into a raised limit (320 MiB), the daemon
# SIGKILLed as the state file shows the resume, 5 s with no daemon (tests/guardian_line.rs). After: the
# guardian lives and holds the line (ROUNDS rounds, 200 MiB/s and 1 GiB/s, signals and the freezer,
# in turn). Before: the guardian killed with the daemon, as no daemon and no guardian watched the
# gap before it held the line (2 rounds, one at each rate, by signals). Each round prints how far past
# its line the hog got and whether the OOM killer fired. Needs root and a v1 memory controller.
set -euo pipefail
cd "$(dirname "$0")/.."
export ROUNDS=${ROUNDS:-12}
cargo test --quiet --test guardian_line -- --include-ignored --test-threads 1 --nocapture 2>&1 |
  grep -E '^round|^test |test result'
