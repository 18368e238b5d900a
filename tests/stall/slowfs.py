#!/usr/bin/python3
"""A real slow filesystem for memwatch's stall test: a FUSE passthrough of SOURCE mounted at MOUNT whose
open() first sleeps for as many seconds as SOURCE/.delay says (0 when absent). Each open is logged to
SOURCE/.opens as "start <monotonic s>" and "end <monotonic s>", so the test can see a read in progress.

Usage: slowfs.py SOURCE MOUNT (Debian: python3-fusepy, fuse3). Runs in the foreground until unmounted.
"""
import os
import sys
import time

from fusepy import FUSE, Operations


class Slow(Operations):
    def __init__(self, root):
        self.root = root

    def _path(self, p):
        return os.path.join(self.root, p.lstrip("/"))

    def _log(self, what):
        with open(os.path.join(self.root, ".opens"), "a") as f:
            f.write(f"{what} {time.monotonic():.6f}\n")

    def getattr(self, p, fh=None):
        st = os.lstat(self._path(p))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, p, fh):
        return [".", ".."] + [n for n in os.listdir(self._path(p)) if not n.startswith(".")]

    def readlink(self, p):
        return os.readlink(self._path(p))

    def open(self, p, flags):
        self._log("start")
        try:
            with open(os.path.join(self.root, ".delay")) as f:
                delay = float(f.read().strip() or 0)
        except OSError:
            delay = 0.0
        time.sleep(delay)
        self._log("end")
        return os.open(self._path(p), flags)

    def read(self, p, size, offset, fh):
        return os.pread(fh, size, offset)

    def release(self, p, fh):
        os.close(fh)


if __name__ == "__main__":
    FUSE(Slow(sys.argv[1]), sys.argv[2], foreground=True, allow_other=True, ro=True)
