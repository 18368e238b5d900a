"""What this process runs with, seen from /proc (Linux): its live DataLoader worker processes."""

from __future__ import annotations

import os
from typing import Dict, List, Optional

# multiprocessing's helper processes are not DataLoader workers.
_HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def live_workers(pid: Optional[int] = None) -> Optional[int]:
    """How many processes descend from `pid` (default: this one), leaving out multiprocessing's
    forkserver and resource tracker: the DataLoader workers that run now. None where /proc cannot
    be read."""
    root = pid or os.getpid()
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(e))
    count, todo = 0, list(children.get(root, []))
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if not any(h in cmdline for h in _HELPERS):
            count += 1
    return count


def _parent(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) >= 2 else None


def descends_from(ancestor: int, pid: Optional[int] = None) -> bool:
    """Whether `ancestor` is among the parents of `pid` (default: this process), up the tree."""
    p = _parent(pid or os.getpid())
    seen = set()
    while p and p not in seen:
        if p == ancestor:
            return True
        seen.add(p)
        p = _parent(p)
    return False
