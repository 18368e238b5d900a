"""One run of a test trainer under memory pressure, against the real daemon in a real memory cgroup.

The trainer starts with 4 DataLoader workers (each holding memory of its own), micro-batch 8 and
accumulation 2, and stops at its first optimizer step. The cgroup's limit then comes down so that the
workers' memory puts it at warn (86 %), and the fake GPU it uses is 92 % full (warn): memwatch stages
fewer workers, pin_memory off, and half the micro-batch with twice the accumulation. The trainer goes
on, applies what its integration applies, and stops again at its end so that the daemon's view of the
job can be read before it detaches.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from conftest import MIB, TRAINERS, Daemon, MemCgroup, eventually, python

# Fast rules for a test: a change a second, verification within 10 s, bounds that allow exactly one
# cut of each knob (workers 4 → 2, micro-batch 8 → 4), and no pause (the cgroup's critical level is
# out of reach: pausing is not what these tests are about).
CONFIG = """
[adapt]
settle_seconds = 1
verify_seconds = 10
min_workers = 2
min_micro_batch = 4
[policy.job_cgroup]
action = "pause"
warn = 0.8
warn_leave = 0.7
critical = 0.995
critical_leave = 0.99
enter_hold_ms = 0
leave_hold_ms = 5000
"""

GENERIC_KEYS = [
    "batch=train.micro_batch",
    "accumulation=train.accumulation",
    "workers=train.workers",
    "pin_memory=train.pin_memory",
]
GENERIC = {"train": {"micro_batch": 8, "accumulation": 2, "workers": 4, "pin_memory": True}, "epochs": 5}
# The same starting values as a transformers TrainingArguments config (the `hf` profile).
HF = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "dataloader_num_workers": 4,
    "dataloader_pin_memory": True,
    "num_train_epochs": 5,
}


@dataclass
class Run:
    records: List[Dict[str, Any]]
    job: Dict[str, Any]
    events: List[Dict[str, Any]]
    oom_kills: int
    returncode: int

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def directives(self) -> List[Dict[str, Any]]:
        return self.job["config"]["directives"]


def read(out: Path) -> List[Dict[str, Any]]:
    if not out.exists():
        return []
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def under_pressure(
    d: Daemon,
    cg: MemCgroup,
    tmp: Path,
    script: str,
    config: Dict[str, Any],
    name: str,
    args: Sequence[str] = (),
    gpu: bool = True,
    timeout: float = 240,
    env: Optional[Dict[str, str]] = None,
) -> Run:
    cfg = tmp / "train.json"
    cfg.write_text(json.dumps(config))
    out, go = tmp / "out.jsonl", tmp / "go"
    argv = [python(), str(TRAINERS / script), str(cfg), str(out), str(go), str(tmp / "output"), *args]
    p = cg.spawn(argv, dict(d.env(), **(env or {})))
    try:
        ready = eventually(120, lambda: _first(out, "ready") or _exited(p), "the trainer never reached its first step")
        assert p.poll() is None, f"the trainer exited with {p.returncode} before its first step"
        assert ready["workers"] == 4, ready
        eventually(20, lambda: d.job(name), f"{name} was never attached")
        oom_before = cg.oom_kills()
        if gpu:
            d.set_gpu(p.pid, 0.92)
        # The workers' memory crosses warn: the limit comes down to where the cgroup sits at 86 %.
        cg.set_limit(int(cg.unreclaimable() / 0.86))
        eventually(
            30,
            lambda: _staged(d, name),
            lambda: f"memwatch staged no change: cgroup {cg.dir} at {cg.unreclaimable() / MIB:.0f} MiB, limit "
            f"{(cg.dir / ('memory.limit_in_bytes' if cg.version == 1 else 'memory.max')).read_text().strip()} "
            f"job {d.job(name)}, events {d.events()[-5:]}",
        )
        go.touch()
        eventually(timeout, lambda: _first(out, "finished") or _exited(p), "the trainer never finished")
        assert p.poll() is None, f"the trainer failed with exit code {p.returncode}"
        # Let the last report and verification land before reading the daemon's view.
        eventually(20, lambda: _settled(d, name), "the acknowledged changes were never verified")
        job = d.job(name)
        assert job is not None
        (tmp / "go.done").touch()
        rc = p.wait(60)
        return Run(read(out), job, d.events(), cg.oom_kills() - oom_before, rc)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def _first(out: Path, kind: str) -> Optional[Dict[str, Any]]:
    return next((r for r in read(out) if r["kind"] == kind), None)


def _exited(p: subprocess.Popen) -> bool:
    return p.poll() is not None


def _staged(d: Daemon, name: str) -> bool:
    job = d.job(name)
    return bool(job and job.get("config") and job["config"]["directives"])


def _settled(d: Daemon, name: str) -> bool:
    """Every directive answered, and none still waiting for its verification."""
    job = d.job(name)
    if not job:
        return False
    ds = job["config"]["directives"]
    return all(
        (x.get("applied_epoch") is not None or x.get("declined"))
        and (x.get("verification") or {}).get("state") != "pending"
        for x in ds
    )


def assert_exact_windows(run: Run, effective: int = 16) -> None:
    """micro × accumulation is exact at every optimizer step: each one saw `effective` samples."""
    steps = run.of("step")
    assert steps, "no optimizer step was recorded"
    wrong = [s for s in steps if s["samples"] != effective]
    assert not wrong, f"optimizer steps with other than {effective} samples: {wrong[:5]}"


def assert_adapted(run: Run) -> None:
    """Both changes were applied for real: fewer live workers, the smaller micro-batch and bigger
    accumulation in the steps themselves; memwatch verified both."""
    steps = run.of("step")
    assert steps[0]["micro"] == 8 and steps[0]["accumulation"] == 2, steps[0]
    assert steps[-1]["micro"] == 4 and steps[-1]["accumulation"] == 4, steps[-1]
    live = [w["live"] for w in run.of("workers")]
    assert live[0] == 4 and live[-1] == 2, f"live DataLoader workers over the run: {live}"
    knobs = run.job["config"]["knobs"]
    assert knobs["workers"] == 2 and knobs["micro_batch"] == 4 and knobs["pin_memory"] is False, knobs
    for x in run.directives():
        assert x.get("applied_epoch") is not None, x
        v = x.get("verification")
        assert v is not None and v["state"] == "verified", x
    # Each rewrite cites the resource, its level and its number.
    rewrites = [e["detail"] for e in run.events if e["action"] == "rewrite"]
    assert rewrites and all("% used)" in r for r in rewrites), rewrites
    assert any("the job's memory cgroup is at warn (" in r for r in rewrites), rewrites
    assert any("GPU 0's memory is at warn (92 % used)" in r for r in rewrites), rewrites
    assert run.oom_kills == 0
    assert run.returncode == 0
