#!/usr/bin/env bash
# Builds the guest the VM tests boot: Debian 13 (trixie: systemd 257, kernel 6.12, the closest to Ubuntu
# 24.04) with cgroup v2 only, as memwatch's users run it, with systemd-oomd enabled (as Ubuntu has it),
# earlyoom installed but not started (the earlyoom scenario starts it) and docker.io installed but not
# started (the containers-v2 scenario starts it and imports its image from the input disk). Prints the image's directory on its last line of stdout:
#   base.img     the root filesystem (ext4, sparse, 3 GiB), made with mkfs.ext4 -d: no loop mounts
#   vmlinuz, initrd.img, cmdline   the kernel, its initramfs and its command line, from the guest's /boot
#
# The image is cached under MEMWATCH_VM_CACHE (default /var/cache/memwatch-vm), in a directory keyed by
# a hash of this script, so it is built once per machine and again only when this script changes; the
# scenarios are not part of it (scripts/vm/run.sh puts them on a disk of their own). Needs root
# (debootstrap) and installs debootstrap when it is missing. The Debian mirror is the one this machine's
# apt uses (MEMWATCH_VM_MIRROR overrides it).
#
# In the guest, memwatch-vm-scenario.service (after multi-user.target) mounts the disk labelled MWIN
# read-only at /mnt/in and the one labelled MWOUT at /mnt/out, runs /mnt/in/run.sh under a timeout
# (/mnt/in/timeout seconds), copies its output to /mnt/out/log and to the serial console, and powers
# the machine off. The guest has no network.
set -euo pipefail
cd "$(dirname "$0")/../.."

log() { echo "vm/image: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (debootstrap)"; exit 1; }

cache=${MEMWATCH_VM_CACHE:-/var/cache/memwatch-vm}
key=$(sha256sum scripts/vm/image.sh | cut -c1-16)
dir=$cache/image-$key
mkdir -p "$cache"
# One build at a time; a second caller waits for it and then uses it.
exec 9>"$cache/lock"
flock 9
if [ -f "$dir/done" ]; then
  echo "$dir"
  exit 0
fi

command -v debootstrap >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}
command -v mkfs.ext4 >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends e2fsprogs >/dev/null
}

# The mirror this machine's apt uses for Debian (scripts/debian-mirror.sh).
suite=trixie
mirror=${MEMWATCH_VM_MIRROR:-$(./scripts/debian-mirror.sh || true)}
[ -n "$mirror" ] || { log "no bookworm mirror in /etc/apt; set MEMWATCH_VM_MIRROR"; exit 1; }

# Older builds of the image go: they are keyed by older versions of this script.
for old in "$cache"/image-*; do
  [ "$old" = "$dir" ] || rm -rf "$old"
done
work=$dir.tmp
rm -rf "$work"
mkdir -p "$work"
root=$work/rootfs
start=$(date +%s)

log "debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,systemd-oomd,udev,dbus,dbus-user-session,libpam-systemd,linux-image-amd64,procps,iproute2,curl,kmod,util-linux,e2fsprogs,jq,attr,earlyoom,docker.io,docker-cli \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}

echo memwatch-vm >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 memwatch-vm\n::1 localhost\n' >"$root/etc/hosts"
echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' >"$root/etc/fstab"
# The guest has no network: apt installs local packages only, and must not try to fetch.
rm -f "$root"/var/lib/apt/lists/*_Packages "$root"/var/cache/apt/archives/*.deb
printf 'APT::Install-Recommends "false";\nAcquire::Languages "none";\n' >"$root/etc/apt/apt.conf.d/90memwatch-vm"
# The journal stays in memory (one boot per run) and off the console, which carries the results.
mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nForwardToConsole=no\n' >"$root/etc/systemd/journald.conf.d/memwatch-vm.conf"
# Nothing to log in with, nothing periodic: the boot does what the scenarios need and no more.
for unit in getty.target serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer systemd-tmpfiles-clean.timer \
  systemd-networkd-wait-online.service earlyoom.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
ln -sf /lib/systemd/system/multi-user.target "$root/etc/systemd/system/default.target"
# docker.io is installed but not started at boot (no scenario but containers-v2 wants it running).
rm -f "$root/etc/systemd/system/multi-user.target.wants/docker.service" \
  "$root/etc/systemd/system/sockets.target.wants/docker.socket" \
  "$root/etc/systemd/system/multi-user.target.wants/containerd.service"
# The guest has no network, nor do the tests' containers: no bridge, no iptables rules.
mkdir -p "$root/etc/docker"
printf '{"iptables": false, "ip6tables": false, "bridge": "none"}\n' >"$root/etc/docker/daemon.json"

cat >"$root/usr/local/sbin/memwatch-vm-scenario" <<'RUNNER'
#!/bin/sh
# Runs the scenarios on the input disk (LABEL=MWIN), keeps their output on the output disk
# (LABEL=MWOUT) and on the serial console, then powers off.
console=/dev/ttyS0
say() { echo "$*" >"$console"; }
mkdir -p /mnt/in /mnt/out
if ! mount -o ro LABEL=MWIN /mnt/in; then
  say "VMRESULT harness fail no input disk (LABEL=MWIN)"
  systemctl poweroff --no-block
  exit 0
fi
mount LABEL=MWOUT /mnt/out || say "VMRESULT harness fail no output disk (LABEL=MWOUT)"
limit=$(cat /mnt/in/timeout 2>/dev/null || echo 1500)
say "VMBOOT up $(cut -d' ' -f1 /proc/uptime) s after the kernel started; kernel $(uname -r), systemd $(systemctl --version | head -n 1 | cut -d' ' -f2), cgroup $(stat -fc %T /sys/fs/cgroup)"
{ timeout -k 10 "$limit" sh /mnt/in/run.sh 2>&1; echo "VMEXIT $?"; } | tee /mnt/out/log >"$console"
if grep -q '^VMEXIT 124' /mnt/out/log; then
  say "VMRESULT harness fail run.sh timed out after $limit s"
  echo "VMRESULT harness fail run.sh timed out after $limit s" >>/mnt/out/log
fi
sync
umount /mnt/out
say "VMDONE"
systemctl poweroff --no-block
RUNNER
chmod 0755 "$root/usr/local/sbin/memwatch-vm-scenario"
cat >"$root/etc/systemd/system/memwatch-vm-scenario.service" <<'UNIT'
[Unit]
Description=memwatch VM scenarios (from the disk labelled MWIN)
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/memwatch-vm-scenario
TimeoutStartSec=infinity
StandardOutput=journal
StandardError=journal

[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/memwatch-vm-scenario.service \
  "$root/etc/systemd/system/multi-user.target.wants/memwatch-vm-scenario.service"

# The kernel and initramfs boot directly (-kernel/-initrd): no boot loader in the image.
cp "$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n 1)" "$work/vmlinuz"
cp "$(ls "$root"/boot/initrd.img-* | sort -V | tail -n 1)" "$work/initrd.img"
# cgroup v2 only; quiet, and no time spent on what a VM has not got (keyboard, mouse, real clocks).
echo "root=/dev/vda rw console=ttyS0,115200 systemd.unified_cgroup_hierarchy=1 quiet loglevel=3" \
  "systemd.show_status=error mitigations=off tsc=reliable no_timer_check i8042.noaux i8042.nomux" \
  "i8042.nopnp i8042.dumbkbd random.trust_cpu=on" >"$work/cmdline"
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/cache/apt/*.bin

truncate -s 3G "$work/base.img"
mkfs.ext4 -q -F -L mwroot -d "$root" "$work/base.img"
rm -rf "$root"
log "built in $(($(date +%s) - start)) s"
touch "$work/done"
mv "$work" "$dir"
echo "$dir"
