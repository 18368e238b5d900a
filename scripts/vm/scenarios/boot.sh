# timeout: 60
# The guest is what memwatch's users run: systemd as PID 1, cgroup v2 only, the kernel and systemd
# Debian 13 ships.
. /mnt/in/lib.sh
S=boot
fs=$(stat -fc %T /sys/fs/cgroup)
pid1=$(cat /proc/1/comm)
v1=$(grep -c cgroup /proc/mounts | tr -d ' ')
detail="PID 1 $pid1, /sys/fs/cgroup $fs ($v1 cgroup mounts), kernel $(uname -r), systemd $(systemctl --version | head -n 1 | cut -d' ' -f2), controllers: $(cat /sys/fs/cgroup/cgroup.controllers), booted in $(cut -d' ' -f1 /proc/uptime) s, system $(systemctl is-system-running)"
if [ "$pid1" = systemd ] && [ "$fs" = cgroup2fs ] && ! grep -q ' cgroup ' /proc/mounts; then
  result $S ok "$detail"
else
  result $S fail "$detail"
fi
exit "${FAILED:-0}"
