#!/usr/bin/env python3
# A crude floor beside `cargo bench --bench scale`'s ONLY=stop rows (BENCHMARKS.md, "On a real GPU")
# and the reflex bench's 1 024-process rows: fork N-1 sleeping children in a process group of their
# own, SIGSTOP them and wait for every stop (waitid WSTOPPED), timed from the first kill to the last
# stop, RUNS times. HOW=loop (the default) sends one kill per child from one loop, as a pause by
# signals does; HOW=group sends one kill to the children's process group, the kernel's own loop.
# Both times are printed: the sending alone, and to the last stop. An upper bound on the floor:
# waitid over N-1 children walks the list on each call.
#
#   python3 scripts/stop-floor.py N RUNS            HOW=group python3 scripts/stop-floor.py N RUNS
import os, signal, sys, time, statistics
n = int(sys.argv[1]); runs = int(sys.argv[2])
how = os.environ.get("HOW", "loop")
if how not in ("loop", "group"):
    sys.exit(f"stop-floor: HOW={how!r}: not loop or group")
kids = []
for _ in range(n - 1):
    p = os.fork()
    if p == 0:
        while True:
            time.sleep(3600)
    # The first child leads the group; each joins it (set from both sides: no race with exec).
    os.setpgid(p, kids[0] if kids else p)
    kids.append(p)
group = kids[0]
time.sleep(1)

def signal_all(sig: int, wait: int) -> tuple[float, float]:
    """Sends `sig` to every child and waits for each to report it: ms to send, and ms in all."""
    t0 = time.perf_counter_ns()
    if how == "group":
        os.killpg(group, sig)
    else:
        for p in kids:
            os.kill(p, sig)
    t1 = time.perf_counter_ns()
    for _ in kids:
        os.waitid(os.P_PGID, group, wait)
    return (t1 - t0) / 1e6, (time.perf_counter_ns() - t0) / 1e6

sent, out = [], []
for r in range(runs):
    s, a = signal_all(signal.SIGSTOP, os.WSTOPPED)
    sent.append(s); out.append(a)
    signal_all(signal.SIGCONT, os.WCONTINUED)
    time.sleep(0.2)
for p in kids:
    os.kill(p, signal.SIGKILL)

def p50_p90_max(v: list[float]) -> str:
    v = sorted(v)
    return f"p50 {statistics.median(v):.2f} ms, p90 {v[max(0, -(-9 * len(v) // 10) - 1)]:.2f} ms, max {v[-1]:.2f} ms"

print(f"floor {n} processes, {how}: sent {p50_p90_max(sent)}; all stopped {p50_p90_max(out)} ({runs} runs)")
