"""The HF callback's cost and speed, measured against the real daemon (scripts/bench-python.sh).

1. Overhead: PAIRS pairs of runs of the tiny GPT-2 Trainer (no DataLoader workers, 12 epochs of 64
   micro-batches), one without and one with `MemwatchCallback`, in alternating order, both attached
   to a daemon (default 1 s sampling) with nothing to change: the difference is the callback's. Steps/s over each run after its first 16 steps; the ratio per pair.
2. Latency: LATENCY runs with 1 DataLoader worker, where the fake GPU goes to warn after the first
   step: the time from memwatch staging the micro-batch change to the first step run with it, and
   from the end of the epoch in which it was staged to that step.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from conftest import Daemon  # noqa: E402

from memwatch import Client  # noqa: E402
from memwatch._proc import live_workers  # noqa: E402

PAIRS = int(os.environ.get("PAIRS", "20"))
LATENCY = int(os.environ.get("LATENCY", "5"))
CONFIG = "[adapt]\nsettle_seconds = 1\nmin_micro_batch = 4\n"


def run(d, tmp, mode, cfg, on_first_step=None):
    while d.job("bench") is not None:  # the previous run's job is dropped once its process is gone
        time.sleep(0.05)
    cfg_path, out = tmp / "train.json", tmp / "steps.jsonl"
    cfg_path.write_text(json.dumps(cfg))
    env = dict(os.environ, **d.env(), ITEM_SECONDS="0")
    p = subprocess.Popen([sys.executable, str(HERE / "hf_steps.py"), str(cfg_path), str(out), mode], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged = None
    if on_first_step is not None:
        while p.poll() is None and not (out.exists() and out.read_text().strip()):
            time.sleep(0.01)
        on_first_step(p.pid)
        while p.poll() is None and staged is None:
            job = d.job("bench")
            ds = (job or {}).get("config", {}).get("directives", [])
            staged = ds[0]["staged_at_ms"] if ds else None
            time.sleep(0.05)
    assert p.wait() == 0, f"the trainer failed ({mode})"
    steps = [json.loads(line) for line in out.read_text().splitlines()]
    return steps, staged


def rate(steps):
    s = steps[16:]
    return (len(s) - 1) / ((s[-1]["ms"] - s[0]["ms"]) / 1000)


def main():
    d = Daemon(CONFIG, interval_ms=1000)  # the default sampling interval
    try:
        base = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "dataloader_num_workers": 0,
                "dataloader_pin_memory": False, "num_train_epochs": 12}
        ratios, without, with_ = [], [], []
        for i in range(PAIRS if PAIRS >= 2 else 0):
            pair = {}
            for mode in (("none", "memwatch") if i % 2 == 0 else ("memwatch", "none")):
                with tempfile.TemporaryDirectory() as tmp:
                    pair[mode] = rate(run(d, Path(tmp), mode, base)[0])
            without.append(pair["none"])
            with_.append(pair["memwatch"])
            ratios.append(pair["memwatch"] / pair["none"])
        q = statistics.quantiles(ratios, n=4) if ratios else [0.0, 0.0, 0.0]
        print(json.dumps({"overhead": {
            "pairs": PAIRS, "steps_per_second_without": round(statistics.median(without), 1) if without else None,
            "steps_per_second_with": round(statistics.median(with_), 1) if with_ else None,
            "ratio_median": round(statistics.median(ratios), 4) if ratios else None, "ratio_q1": round(q[0], 4), "ratio_q3": round(q[2], 4)}}))

        # The callback's own work, timed alone: one forced directives round trip (it polls at most
        # every 0.5 s) and one progress report with the live-worker count from /proc (every 2 s).
        sleeper = subprocess.Popen(["sleep", "600"])
        with tempfile.TemporaryDirectory() as tmp:
            cfg_path = Path(tmp) / "train.json"
            cfg_path.write_text(json.dumps({"train": {"micro_batch": 8, "accumulation": 1}}))
            c = Client("bench-costs", config_file=str(cfg_path), socket_path=str(d.socket), pid=sleeper.pid,
                       keys=["batch=train.micro_batch", "accumulation=train.accumulation"])
            assert c.attach()
        poll = []
        for _ in range(200):
            t = time.perf_counter()
            c.directives(force=True)
            poll.append(time.perf_counter() - t)
        report = []
        for _ in range(50):
            t = time.perf_counter()
            c.progress(0, 1, running={"workers": live_workers(), "micro_batch": 8})
            report.append(time.perf_counter() - t)
        # What the callback adds to each step when nothing is pending: its on_step_end, timed alone.
        from types import SimpleNamespace

        from transformers import TrainerControl

        from memwatch.hf import MemwatchCallback

        cb = MemwatchCallback(c)
        c.directives(force=True)
        state, control = SimpleNamespace(epoch=0.0, global_step=1), TrainerControl()
        calls = 20000
        t = time.perf_counter()
        for _ in range(calls):
            cb.on_step_end(None, state, control)
        step_us = (time.perf_counter() - t) / calls * 1e6
        sleeper.kill()
        per_second = statistics.median(poll) / 0.5 + statistics.median(report) / 2.0
        print(json.dumps({"costs_us": {
            "directives_round_trip_median": round(statistics.median(poll) * 1e6),
            "progress_with_live_workers_median": round(statistics.median(report) * 1e6),
            "on_step_end_mean_us": round(step_us, 2),
            "share_of_training_time": round(per_second, 6)}}))

        lat = dict(base, gradient_accumulation_steps=2, dataloader_num_workers=1, num_train_epochs=4)
        staged_to_step, boundary_to_step, epoch_ms = [], [], []
        for _ in range(LATENCY):  # LATENCY=0 skips this part
            with tempfile.TemporaryDirectory() as tmp:
                steps, staged = run(d, Path(tmp), "memwatch", lat, on_first_step=lambda pid: d.set_gpu(pid, 0.92))
            first = next(s for s in steps if s["micro"] == 4)
            before = [s for s in steps if s["ms"] < first["ms"]]
            staged_to_step.append(first["ms"] - staged)
            boundary_to_step.append(first["ms"] - before[-1]["ms"])
            per_epoch = len(steps) // 4
            epoch_ms.append(steps[per_epoch]["ms"] - steps[0]["ms"])
        if not staged_to_step:
            return
        print(json.dumps({"latency_ms": {
            "runs": LATENCY, "staged_to_first_step_median": round(statistics.median(staged_to_step)),
            "staged_to_first_step_max": round(max(staged_to_step)),
            "last_old_step_to_first_new_step_median": round(statistics.median(boundary_to_step)),
            "epoch_median": round(statistics.median(epoch_ms))}}))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
