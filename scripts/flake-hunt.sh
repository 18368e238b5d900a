#!/usr/bin/env bash
# Runs test binaries many times, idle or with both cores kept busy, and says per test how often it
# failed: the way to find a flaky test before CI does. Nothing is retried; every failure is counted
# and its output kept under target/flake-hunt/.
#
#   scripts/flake-hunt.sh [-n RUNS] [--load] [--fresh-users] [--python] [TEST ...]
#
# TEST names a test target (attach, attacks, ... as in tests/*.rs, or `lib` for the unit tests);
# none means every target. --python runs the Python suite too (python/tests, as scripts/test.sh
# does). --load runs `stress-ng --cpu N` (N = the cores) for the whole hunt. --fresh-users removes
# the test users before every run, as on a machine that never ran the tests (the tests then make them). Build and environment as
# scripts/test.sh (run that once first: it installs what the tests need). Needs root, as the tests do.
# Prints a Markdown table: target, mode, runs, failed runs, median seconds, and each failing test
# with how many runs it failed in.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=5 load=0 python=0 fresh=0 targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs=$2; shift 2 ;;
    --load) load=1; shift ;;
    --python) python=1; shift ;;
    --fresh-users) fresh=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "scripts/flake-hunt.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "scripts/flake-hunt.sh: -n takes a whole number above 0, not '$runs'" >&2; exit 2; }

features=()
venv=${MEMWATCH_VENV:-$PWD/.venv}
if [ -z "${MEMWATCH_SKIP_TRAINER:-}" ] && [ -x "$venv/bin/python" ]; then
  torchlib=$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export PATH="$venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1 LD_LIBRARY_PATH="$torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  features=(--features memwatch/trainer)
fi
export MEMWATCH_KUBERNETES_VALIDATE=${MEMWATCH_KUBERNETES_VALIDATE:-$PWD/target/validate-venv/bin/kubernetes-validate}
[ "$(id -u)" != 0 ] || [ "$fresh" = 1 ] || ./scripts/test-users.sh

if [ ${#targets[@]} -eq 0 ]; then
  targets=(lib)
  for f in tests/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
cargo test --workspace "${features[@]}" --locked --no-run -q 2>/dev/null

mode=idle
[ "$fresh" = 0 ] || mode=fresh
out=target/flake-hunt
mkdir -p "$out"
stress=
if [ "$load" = 1 ]; then
  mode=$mode-load
  command -v stress-ng >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null; }
  stress-ng --cpu "$(nproc)" --quiet &
  stress=$!
  trap 'kill $stress 2>/dev/null' EXIT
fi

report="$out/report-$mode.md"
echo "| target | mode | runs | failed runs | median s | failing tests (runs failed) |" | tee "$report"
echo "|---|---|---|---|---|---|" | tee -a "$report"

median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "-"; else if (NR % 2) printf "%.1f\n", a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }

hunt() { # name, then the command
  local name=$1; shift
  local failed=0 times=() tests
  declare -A count=()
  for i in $(seq "$runs"); do
    local log="$out/$mode-$name-$i.log" t0 rc
    [ "$fresh" = 0 ] || ./scripts/test-users.sh --remove
    t0=$(date +%s.%N)
    set +e
    timeout 1200 "$@" >"$log" 2>&1
    rc=$?
    set -e
    times+=("$(echo "$(date +%s.%N) - $t0" | bc)")
    if [ "$rc" != 0 ]; then
      failed=$((failed + 1))
      # libtest: "test NAME ... FAILED"; pytest -rf: "FAILED path::NAME - ..."; else the whole run.
      tests=$(grep -oE '^test [^ ]+ \.\.\. FAILED|^FAILED [^ ]+' "$log" | sed -E 's/^test ([^ ]+) .*/\1/; s/^FAILED //' | sort -u || true)
      [ -n "$tests" ] || tests="(exit $rc$([ "$rc" = 124 ] && echo ', timed out'))"
      while read -r t; do count[$t]=$(( ${count[$t]:-0} + 1 )); done <<<"$tests"
    else
      rm -f "$log"
    fi
  done
  local which=""
  for t in "${!count[@]}"; do which+="${which:+, }$t (${count[$t]})"; done
  echo "| $name | $mode | $runs | $failed | $(printf '%s\n' "${times[@]}" | median) | ${which:--} |" | tee -a "$report"
}

for t in "${targets[@]}"; do
  if [ "$t" = lib ]; then
    hunt lib cargo test "${features[@]}" --locked --lib -p memwatch
  else
    hunt "$t" cargo test "${features[@]}" --locked --test "$t"
  fi
done
if [ "$python" = 1 ]; then
  cargo build --locked "${features[@]}" -q -p memwatch -p memwatch-fake-nvml
  hunt python bash -c "cd python && '$venv/bin/python' -m pytest -q -rf -p no:cacheprovider"
fi
echo "report: $report; logs of failed runs: $out/$mode-*.log"
