# The checks of scripts/gpu-check.sh, sourced by it (and by tests/gpu_check.rs, which shows each one
# failing on a wrong figure). Each check prints one line, `PASS NAME: …` or `FAIL NAME: …`, naming
# what was compared; `summary` prints the failed ones and returns 1 when there were any.
# bash (arrays); awk for the arithmetic (figures are bytes, MiB and °C, not always integers).

GPU_CHECK_FAILED=()

pass() { echo "PASS $1: $2"; }
fail() {
  echo "FAIL $1: $2"
  GPU_CHECK_FAILED+=("$1")
}

# is_number VALUE: a decimal number (a figure a command printed, not an error message).
is_number() { [[ $1 =~ ^-?[0-9]+([.][0-9]+)?$ ]]; }

# near NAME GOT WANT TOLERANCE_PERCENT [SLACK]: |GOT - WANT| <= WANT * TOLERANCE / 100 + SLACK.
near() {
  local name=$1 got=$2 want=$3 pct=$4 slack=${5:-0}
  if ! is_number "$got" || ! is_number "$want"; then
    fail "$name" "not figures: memwatch said '$got', the reference '$want'"
    return
  fi
  if awk -v g="$got" -v w="$want" -v p="$pct" -v s="$slack" \
    'BEGIN { d = g - w; if (d < 0) d = -d; lim = (w < 0 ? -w : w) * p / 100 + s; exit !(d <= lim) }'; then
    pass "$name" "memwatch $got, reference $want (within $pct %${slack:+ + $slack})"
  else
    fail "$name" "memwatch $got, reference $want: off by more than $pct %${slack:+ + $slack}"
  fi
}

# above NAME GOT FLOOR: GOT > FLOOR.
above() {
  if ! is_number "$2"; then
    fail "$1" "not a figure: '$2'"
  elif awk -v g="$2" -v f="$3" 'BEGIN { exit !(g > f) }'; then
    pass "$1" "$2, above $3"
  else
    fail "$1" "$2, not above $3"
  fi
}

# equal NAME GOT WANT: the same text.
equal() {
  if [ "$2" = "$3" ]; then pass "$1" "$2"; else fail "$1" "got '$2', want '$3'"; fi
}

# all_states NAME WANT_REGEX STATES: every "pid:STATE" pair in STATES (space-separated) matches, and
# there is at least one.
all_states() {
  local name=$1 want=$2 states=$3 bad='' n=0 p
  for p in $states; do
    n=$((n + 1))
    [[ ${p#*:} =~ ^($want)$ ]] || bad="$bad $p"
  done
  if [ "$n" = 0 ]; then
    fail "$name" "no processes to look at"
  elif [ -n "$bad" ]; then
    fail "$name" "not in state $want:$bad (all: $states)"
  else
    pass "$name" "$n processes in state $want: $states"
  fi
}

# not_run NAME WHY: a check that could not run here; it fails unless GPU_CHECK_SKIP (comma-separated)
# names it.
not_run() {
  case ",${GPU_CHECK_SKIP:-}," in
    *",$1,"*) echo "SKIP $1: $2 (allowed by GPU_CHECK_SKIP)" ;;
    *) fail "$1" "not run: $2 (GPU_CHECK_SKIP=$1 allows it)" ;;
  esac
}

summary() {
  if [ "${#GPU_CHECK_FAILED[@]}" = 0 ]; then
    echo "gpu-check: every check passed"
    return 0
  fi
  echo "gpu-check: ${#GPU_CHECK_FAILED[@]} failed: ${GPU_CHECK_FAILED[*]}"
  return 1
}
