#!/usr/bin/env bash
# Puts this machine back as a fresh one would be for the tests, so that a green run cannot lean on
# what an earlier run left: .ci/run calls it before the README's test command. Needs root; prints
# what it removed. It removes only what the tests make, by the names they give it:
# - processes of the test users, and the test users, their groups and home directories;
# - cgroups the tests name (memwatch-*, memwatch, and the test Slurm nodes' slurm_mw*), in every
#   hierarchy: thawed, emptied (SIGKILL), removed deepest first;
# - the network devices of the two-node Slurm test cluster (a bridge mwb<pid><letter>, veth pairs
#   mwv<pid><letter><n>), of bridge and veth type only;
# - containers the container tests ran (docker and podman, named mw-test-*);
# - emergency swap (zram) left enabled, the users' lock file, the tests' files in /dev/shm and the
#   private directories of killed launches;
# - the daemon's default state and socket directories (/var/lib/memwatch, /run/memwatch), which a
#   test of the installed package may have made, when no installed memwatch service uses them.
# Installed Debian packages, pip's and cargo's download caches stay: they are not build outputs, and
# scripts/test.sh installs them on a machine that lacks them.
set -uo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "scripts/ci-clean.sh: not root; nothing cleaned" >&2; exit 0; }
said() { echo "ci-clean: $*"; }

# Daemons and cluster processes the tests start, if any outlived their run.
for name in memwatch memwatch-train slurmctld slurmd slurmstepd munged prometheus memhog; do
  for pid in $(pgrep -x "$name" 2>/dev/null); do
    # Not an installed service's daemon (systemd's, with its own config).
    # Only those the tests started: their config and state live in the temporary directory.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "${TMPDIR:-/tmp}/" || continue
    kill -KILL "$pid" 2>/dev/null && said "killed $name ($pid)"
  done
done

# Containers the container tests ran (mw-test-*), if any outlived their run, before their cgroups go.
if docker info >/dev/null 2>&1; then
  for c in $(docker ps -aq --filter name=mw-test- 2>/dev/null); do
    docker rm -f "$c" >/dev/null 2>&1 && said "removed docker container $c"
  done
fi
if command -v podman >/dev/null 2>&1; then
  for c in $(podman --cgroup-manager=cgroupfs --events-backend=file ps -aq --filter name=mw-test- 2>/dev/null); do
    podman --cgroup-manager=cgroupfs --events-backend=file rm -f "$c" >/dev/null 2>&1 && said "removed podman container $c"
  done
fi

# Cgroups, deepest first: thaw, kill what is inside, remove; again until it is gone (a process may be
# between two hierarchies, or exiting, at the first try).
empty_out() {
  local d=$1 f pid
  [ -f "$d/freezer.state" ] && echo THAWED >"$d/freezer.state" 2>/dev/null
  [ -f "$d/cgroup.freeze" ] && echo 0 >"$d/cgroup.freeze" 2>/dev/null
  [ -f "$d/cgroup.kill" ] && echo 1 >"$d/cgroup.kill" 2>/dev/null
  for f in "$d/cgroup.procs" "$d/tasks"; do
    [ -f "$f" ] || continue
    while read -r pid; do kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; done <"$f"
  done
}
mapfile -t groups < <(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d \
  \( -name 'memwatch-*' -o -name memwatch -o -name 'slurm_mw*' \) 2>/dev/null)
for _ in $(seq 50); do
  left=()
  for top in "${groups[@]}"; do
    [ -d "$top" ] || continue
    mapfile -t dirs < <(find "$top" -depth -type d 2>/dev/null)
    for d in "${dirs[@]}"; do empty_out "$d"; done
    for d in "${dirs[@]}"; do rmdir "$d" 2>/dev/null; done
    if [ -d "$top" ]; then left+=("$top"); else said "removed cgroup $top"; fi
  done
  [ ${#left[@]} -eq 0 ] && break
  groups=("${left[@]}")
  sleep 0.1
done
for top in "${left[@]}"; do said "could not remove cgroup $top"; done

# The two-node Slurm cluster's bridge and veths (tests/common/netns.rs); its namespaces end with their
# last process, killed above.
if command -v ip >/dev/null 2>&1; then
  for kind in veth bridge; do
    ip -o link show type "$kind" 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' |
      grep -E '^mw[bv][0-9]+[a-z][0-9]*p?$' | while read -r link; do
        ip link del "$link" 2>/dev/null && said "removed $kind $link"
      done
  done
fi

# Emergency swap that a killed daemon left on.
while read -r dev _; do
  case "$dev" in
    /dev/zram*)
      swapoff "$dev" 2>/dev/null && said "swapoff $dev"
      n=${dev#/dev/zram}
      echo 1 >"/sys/block/zram$n/reset" 2>/dev/null
      echo "$n" >/sys/class/zram-control/hot_remove 2>/dev/null && said "removed zram$n"
      ;;
  esac
done < <(tail -n +2 /proc/swaps)

scripts/test-users.sh --remove && said "removed the test users and groups"
rm -f "${TMPDIR:-/tmp}/memwatch-test-users.lock"
# The tests' files and directories in /dev/shm (their daemons' directories: tests/common's tempdir).
rm -rf /dev/shm/memwatch-*
# Private directories of launches killed before they could remove their own.
rm -rf "${TMPDIR:-/tmp}"/memwatch-launch-*

if ! systemctl is-active --quiet memwatch 2>/dev/null; then
  for d in /var/lib/memwatch /run/memwatch; do
    [ -e "$d" ] && rm -rf "$d" && said "removed $d"
  done
fi
exit 0
