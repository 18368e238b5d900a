# memhog's stamps (`--stamps`: CLOCK_BOOTTIME µs and MiB touched, one line per chunk) read against a
# cgroup: prints "RATE DECIDED LAST": the MiB/s from 25 to 75 % of the limit, ms from the crossing of
# 95 % to the pause memwatch decided, and ms from that crossing to the job's last progress ("none"
# where it never crossed, or no pause was decided after it). The cgroup's usage at a stamp is its
# usage before growth (base) plus memhog's share of what it has charged since, as read once frozen
# (used): page tables and the like grow with what is touched. dec: the pause's since_ms; anchor: the
# state file's clock anchor (the two on memwatch's clock, CLOCK_BOOTTIME ms once the anchor is taken
# off). Used by scenarios/reaction-v2.sh in the VM and scripts/bench-reaction-v2.sh on a machine.
{ t[NR] = $1 / 1000; mib[NR] = $2; top = $2 }
END {
  for (i = 1; i <= NR; i++) {
    u = base + (top > 0 ? (used - base) * mib[i] / top : 0)
    if (!a25 && u >= 0.25 * lim) { a25 = t[i]; m25 = mib[i] }
    if (!a75 && u >= 0.75 * lim) { a75 = t[i]; m75 = mib[i] }
    if (!x && u >= 0.95 * lim) x = t[i]
  }
  r = (a75 > a25) ? (m75 - m25) / ((a75 - a25) / 1000) : 0
  d = (dec > 0) ? dec - anchor : 0
  if (!x) printf "%.0f none none\n", r
  else printf "%.0f %s %.2f\n", r, (d > 0 && d >= x ? sprintf("%.2f", d - x) : "none"), t[NR] - x
}
