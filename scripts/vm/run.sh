#!/usr/bin/env bash
# Boots the Debian 13 guest (scripts/vm/image.sh: systemd 257, kernel 6.12, cgroup v2 only) under qemu
# and runs the named scenarios in it, in order, in one boot, against the memwatch .deb:
#
#   sudo ./scripts/vm/run.sh install freeze-v2 crash-under-systemd
#
# Scenarios are scripts/vm/scenarios/NAME.sh; each reports `VMRESULT NAME ok|fail DETAIL` lines, which
# this prints. Exits 1 when any failed or a named one reported nothing, 2 on bad usage.
#
# Inputs: the newest target/debian/memwatch_*.deb (scripts/build-deb.sh; MEMWATCH_VM_DEB overrides) and
# memhog (target/debug or target/release; MEMWATCH_VM_MEMHOG overrides). They go on a disk of their
# own (ext4, label MWIN), read-only in the guest; the guest writes to a third (MWOUT), read back with
# debugfs; the root is a qcow2 overlay on the cached image, so a boot never changes the image. Nothing
# is mounted on this machine.
#
# MEMWATCH_VM_ACCEL: tcg (the default: multi-threaded TCG, which needs nothing from the host) or kvm
# (where /dev/kvm can boot a stock kernel). MEMWATCH_VM_TIMEOUT: the boot's wall-clock limit in seconds
# (default 2400: on a slow host the TCG guest ran the scenarios in about 1400 s); a guest that dies or
# hangs before its first scenario (MEMWATCH_VM_BOOT_LIMIT, 300 s) is booted once more. GAP_ROUNDS,
# GAP_BEFORE, CRASH_ROUNDS, RUNS and LEVEL_RUNS, when set, size the scenarios that count rounds (the
# defaults are CI's; BENCHMARKS.md says which sizes gave its figures). The last run's serial log and output disk are kept in target/vm/.
# Needs root (debootstrap for the image); installs qemu when it is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

log() { echo "vm: $*" >&2; }
[ $# -gt 0 ] || { log "usage: scripts/vm/run.sh SCENARIO... (from scripts/vm/scenarios/)"; exit 2; }
for s in "$@"; do
  [ -f "scripts/vm/scenarios/$s.sh" ] || { log "no scenario $s (scripts/vm/scenarios/$s.sh)"; exit 2; }
done
[ "$(id -u)" = 0 ] || { log "run as root"; exit 2; }

# This machine's (Debian 12) qemu-system-x86 wants qemu-utils of its own version; a newer one (backports) is
# downgraded to it.
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || ! command -v qemu-img >/dev/null 2>&1; then
  apt-get update -qq
  v=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ { print $2 }')
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades \
    "qemu-system-x86=$v" "qemu-utils=$v" >/dev/null
fi

deb=${MEMWATCH_VM_DEB:-$(ls -t target/debian/memwatch_*.deb 2>/dev/null | head -n 1 || true)}
[ -f "$deb" ] || { log "no memwatch .deb in target/debian: ./scripts/build-deb.sh [--debug] makes it"; exit 2; }
memhog=${MEMWATCH_VM_MEMHOG:-$(ls -t target/debug/memhog target/release/memhog 2>/dev/null | head -n 1 || true)}
[ -x "$memhog" ] || { log "no memhog in target/: cargo build -p memwatch-memhog makes it"; exit 2; }

image=$(./scripts/vm/image.sh | tail -n 1)

work=$(mktemp -d "${TMPDIR:-/tmp}/memwatch-vm.XXXXXX")
qemu_pid=
cleanup() {
  [ -z "$qemu_pid" ] || kill -KILL "$qemu_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The input disk: the package, memhog, the scenarios and the guest's runner.
in=$work/in
mkdir -p "$in/scenarios"
cp "$deb" "$in/"
cp "$memhog" "$in/memhog"
cp scripts/vm/scenarios/*.sh "$in/scenarios/"
mv "$in/scenarios/lib.sh" "$in/lib.sh"
cp scripts/vm/scenarios/*.awk "$in/"
cp scripts/vm/guest-run.sh "$in/run.sh"
printf '%s\n' "$@" >"$in/scenarios/list"
# A scenario whose header says `# needs: container-rootfs` gets the container tests' image root
# (scripts/container-image.sh, cached) on the input disk as rootfs.tar.
for s in "$@"; do
  if grep -q '^# needs: container-rootfs' "scripts/vm/scenarios/$s.sh" && [ ! -f "$in/rootfs.tar" ]; then
    cp "$(./scripts/container-image.sh --rootfs | tail -n 1)" "$in/rootfs.tar"
  fi
done
# The scenarios' sizes: each runs at the size that proves it by default (what CI runs); a benchmark
# run asks for more through these, passed to the guest (e.g. GAP_ROUNDS=40 for BENCHMARKS.md's figures).
for v in GAP_ROUNDS GAP_BEFORE CRASH_ROUNDS RUNS LEVEL_RUNS; do
  if [ -n "${!v:-}" ]; then
    case ${!v} in *[!0-9]*) log "$v must be a whole number, not ${!v}"; exit 2 ;; esac
    echo "export $v=${!v}"
  fi
done >"$in/env"
# The guest's own limit on run.sh: the scenarios' timeouts added up.
total=0
for s in "$@"; do
  t=$(sed -n 's/^# timeout: //p' "scripts/vm/scenarios/$s.sh")
  total=$((total + ${t:-300} + 10))
done
echo "$total" >"$in/timeout"
size=$(( $(du -sm "$in" | cut -f1) + 32 ))
truncate -s "${size}M" "$work/in.img"
mkfs.ext4 -q -F -L MWIN -d "$in" "$work/in.img"
accel=${MEMWATCH_VM_ACCEL:-tcg}
case $accel in
  tcg) accel_args=(-accel tcg,thread=multi -cpu max) ;;
  kvm) accel_args=(-accel kvm -cpu host) ;;
  *) log "MEMWATCH_VM_ACCEL must be tcg or kvm, not $accel"; exit 2 ;;
esac
limit=${MEMWATCH_VM_TIMEOUT:-2400}
# One boot on a fresh overlay and output disk. A kernel that panics reboots at once (panic=-1), which
# -no-reboot turns into qemu's exit, instead of hanging until the limit.
boot() {
  truncate -s 64M "$work/out.img"
  mkfs.ext4 -q -F -L MWOUT "$work/out.img"
  rm -f "$work/root.qcow2"
  qemu-img create -q -f qcow2 -b "$image/base.img" -F raw "$work/root.qcow2"
  : >"$work/serial.log"
  log "booting ($accel, limit $limit s): $*"
  start=$(date +%s)
  timeout --signal=KILL "$limit" qemu-system-x86_64 "${accel_args[@]}" -smp 2 -m 4096 \
    -nodefaults -display none -no-reboot -monitor none -serial "file:$work/serial.log" \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" -append "$(cat "$image/cmdline") panic=-1" \
    -drive "file=$work/root.qcow2,if=virtio,format=qcow2" \
    -drive "file=$work/in.img,if=virtio,format=raw,readonly=on" \
    -drive "file=$work/out.img,if=virtio,format=raw" &
  qemu_pid=$!
  # A guest whose first scenario has not begun after MEMWATCH_VM_BOOT_LIMIT s (300) is hung at boot.
  while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -gt "${MEMWATCH_VM_BOOT_LIMIT:-300}" ] && ! grep -a -q '^VMSTART ' "$work/serial.log"; then
      log "no scenario began within ${MEMWATCH_VM_BOOT_LIMIT:-300} s of the boot: killing qemu"
      kill -KILL "$qemu_pid" 2>/dev/null
      break
    fi
    sleep 2
  done
  status=0
  wait "$qemu_pid" || status=$?
  qemu_pid=
}
boot "$@"
# A guest that died before its first scenario began (seen: a kernel panic in the timer code at 1 s
# under TCG) is booted once more; one that died later is a result.
if ! grep -a -q -E '^VM(START|RESULT) ' "$work/serial.log"; then
  log "the guest died before its scenarios began (qemu exited $status after $(($(date +%s) - start)) s; serial log's tail below); booting again"
  tail -n 8 "$work/serial.log" | tr -d '\r' >&2
  boot "$@"
fi
took=$(($(date +%s) - start))
[ "$status" = 0 ] || log "qemu exited with $status after $took s (137: killed at the $limit s limit)"

mkdir -p "$work/out"
debugfs -R "rdump / $work/out" "$work/out.img" >/dev/null 2>&1 || true
keep=target/vm
rm -rf "$keep"
mkdir -p "$keep"
cp -r "$work/serial.log" "$work/out" "$keep/" 2>/dev/null || true

# The results: from the output disk, else (a guest that died before it synced) from the serial log.
results=$(grep -a '^VMRESULT ' "$work/out/log" 2>/dev/null || true)
[ -n "$results" ] || results=$(tr -d '\r' <"$work/serial.log" | grep -a '^VMRESULT ' || true)
boot=$(tr -d '\r' <"$work/serial.log" | grep -a '^VMBOOT ' | head -n 1 || true)
log "qemu ran $took s; ${boot:-the guest never reported booting}"
tr -d '\r' <"$work/serial.log" | grep -a -E '^VM(START|END) ' >&2 || true
[ -z "$results" ] || echo "$results"

failed=0
for s in "$@"; do
  grep -q "^VMRESULT $s " <<<"$results" || { echo "VMRESULT $s fail reported nothing"; failed=1; }
done
grep -q '^VMRESULT [^ ]* fail' <<<"$results" && failed=1
if [ "$failed" = 1 ]; then
  for j in "$work"/out/journal-*.txt; do
    [ -f "$j" ] || continue
    log "$(basename "$j")"
    cat "$j" >&2
  done
  if [ -z "$results" ]; then
    log "serial log's tail:"
    tail -n 60 "$work/serial.log" >&2
  fi
fi
exit "$failed"
