#!/usr/bin/env python3
# A crude floor beside `cargo bench --bench scale`'s ONLY=stop rows (BENCHMARKS.md, "On a real GPU"):
# fork N-1 sleeping children, SIGSTOP each from one loop and wait for every stop (waitid WSTOPPED),
# timed from the first kill to the last stop, RUNS times. An upper bound on the floor: waitid over
# N-1 children walks the list on each call.
#
#   python3 scripts/stop-floor.py N RUNS
import os, signal, sys, time, statistics
n = int(sys.argv[1]); runs = int(sys.argv[2])
kids = []
for _ in range(n - 1):
    p = os.fork()
    if p == 0:
        while True:
            time.sleep(3600)
    kids.append(p)
time.sleep(1)

def signal_all(sig: int, wait: int) -> float:
    """Sends `sig` to every child from one loop and waits for each to report it: ms in all."""
    t0 = time.perf_counter_ns()
    for p in kids:
        os.kill(p, sig)
    for _ in kids:
        os.waitid(os.P_ALL, 0, wait)
    return (time.perf_counter_ns() - t0) / 1e6

out = []
for r in range(runs):
    out.append(signal_all(signal.SIGSTOP, os.WSTOPPED))
    signal_all(signal.SIGCONT, os.WCONTINUED)
    time.sleep(0.2)
for p in kids:
    os.kill(p, signal.SIGKILL)
out.sort()
print(f"floor {n} processes: kill loop -> all stopped p50 {statistics.median(out):.2f} ms, p90 {out[max(0, -(-9 * len(out) // 10) - 1)]:.2f} ms, max {out[-1]:.2f} ms ({runs} runs)")
