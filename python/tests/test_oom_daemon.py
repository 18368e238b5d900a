"""memwatch knows of every out-of-memory error inside a step, checked from outside the job: the real
daemon's API, events, `/metrics` and the config file it rewrote; and an OOM at the floor under
`memwatch launch` ends in a checkpoint and one relaunch that finishes the run, not a loop."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List


from conftest import BIN, TRAINERS, eventually, python  # noqa: E402

sys.path.insert(0, str(TRAINERS))


def read(path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def close(a: List[List[float]], b: List[List[float]]) -> bool:
    return all(abs(x - y) <= 1e-12 + 1e-10 * abs(y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def reference(tmp_path, micro: int, accumulation: int, epochs: int = 2) -> List[Dict[str, Any]]:
    """The same run with no OOM, started at `micro` × `accumulation`, and no daemon."""
    cfg, out = tmp_path / f"ref-{micro}.json", tmp_path / f"ref-{micro}.jsonl"
    cfg.write_text(json.dumps({"train": {"micro_batch": micro, "accumulation": accumulation}, "epochs": epochs}))
    env = {"MEMWATCH_SOCKET": str(tmp_path / "none.sock"), "MEMWATCH_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([python(), str(TRAINERS / "oom_train.py"), str(cfg), str(out), str(tmp_path / "ref.pt")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return [r for r in read(out) if r["kind"] == "step"]


def test_a_recovered_oom_is_an_event_a_metric_a_jobs_line_and_a_staged_config(daemon_factory, tmp_path):
    d = daemon_factory()
    cfg, out, gate = tmp_path / "train.json", tmp_path / "out.jsonl", tmp_path / "gate"
    cfg.write_text(json.dumps({"train": {"micro_batch": 8, "accumulation": 2}, "epochs": 2, "oom": {"from": 2, "forward": 4}}))
    p = subprocess.Popen([python(), str(TRAINERS / "oom_train.py"), str(cfg), str(out), str(tmp_path / "c.pt"), str(gate)],
                         env=dict(d.env(), MEMWATCH_JOB="oom"), stderr=subprocess.PIPE, text=True)
    try:
        eventually(120, lambda: out.exists() and read(out)[-1]["kind"] == "end" or p.poll() is not None,
                   "the run never ended")
        assert p.poll() is None, p.stderr.read() if p.stderr else ""
        job = d.job("oom")
        assert job is not None
        oom = job["cuda_oom"]
        assert (oom["recovered"], oom.get("stopped", 0)) == (1, 0), oom
        last = oom["last"]
        assert (last["phase"], last["micro_batch_before"], last["micro_batch_after"], last["accumulation_after"]) == (
            "forward", 8, 4, 4)
        assert last["requested_bytes"] == 2 << 30
        events = [e for e in d.events() if e.get("reason") == "cuda_oom"]
        assert [e["action"] for e in events] == ["cuda_oom", "rewrite"], events
        assert "micro-batch 4" in events[0]["detail"], events
        assert 'memwatch_job_cuda_oom_total{job_name="oom",outcome="recovered"} 1' in d.metrics()
        # The config file holds the halved micro-batch, so a relaunch starts from it.
        assert json.loads(cfg.read_text())["train"] == {"micro_batch": 4, "accumulation": 4}
        jobs = subprocess.run([str(BIN), "jobs", "--socket", str(d.socket)], capture_output=True, text=True, timeout=30)
        assert "CUDA OOM" in jobs.stdout, jobs.stdout
    finally:
        gate.touch()
        p.wait(60)
    assert p.returncode == 0
    steps = [r for r in read(out) if r["kind"] == "step"]
    ref = reference(tmp_path, 4, 4)
    assert len(steps) == len(ref) and all(close(a["weights"], b["weights"]) for a, b in zip(steps, ref))


def test_an_oom_at_the_floor_under_launch_checkpoints_and_the_relaunch_finishes_the_run(daemon_factory, tmp_path):
    d = daemon_factory()
    cfg, out = tmp_path / "train.json", tmp_path / "out.jsonl"
    # Micro-batch 8 → 4 recovers; 4 → 2 is below the floor of 4: a checkpoint, and a relaunch.
    cfg.write_text(json.dumps({"train": {"micro_batch": 8, "accumulation": 2, "min_micro_batch": 4}, "epochs": 2,
                               "oom": {"from": 5, "forward": 2}}))
    keys = ["--key", "batch=train.micro_batch", "--key", "accumulation=train.accumulation"]
    launch = subprocess.run(
        [str(BIN), "launch", "--name", "oomfloor", "--max-restarts", "2", "--config-file", str(cfg), "--profile",
         "generic", *keys, "--socket", str(d.socket), "--",
         python(), str(TRAINERS / "oom_train.py"), str(cfg), str(out), str(tmp_path / "c.pt")],
        capture_output=True, text=True, timeout=300,
    )
    text = launch.stdout + launch.stderr
    assert launch.returncode == 0, text[-4000:]
    assert "run 2: finished" in text and "run 3" not in text, text[-4000:]
    assert "CUDA OOM at its floor micro-batch" in text, text[-4000:]
    records = read(out)
    starts = [r for r in records if r["kind"] == "start"]
    assert [s["resumed"] for s in starts] == [False, True]
    # The relaunch resumed at the window where the first run stopped, at the micro-batch it reached.
    assert (starts[1]["micro"], starts[1]["accumulation"]) == (4, 4), starts
    stopped = [e for e in d.events() if e.get("action") == "cuda_oom"]
    assert any("floor" in e["detail"] for e in stopped), stopped
    final = [r for r in records if r["kind"] == "step"][-1]
    ref = reference(tmp_path, 4, 4)
    assert close(final["weights"], ref[-1]["weights"]), "the relaunched run did not end where a run at 4 × 4 does"


def test_lightning_takes_the_way_out_with_a_checkpoint_and_the_half_micro_batch_staged(daemon_factory, tmp_path):
    d = daemon_factory()
    cfg, ckpt = tmp_path / "train.json", tmp_path / "memwatch.ckpt"
    cfg.write_text(json.dumps({"train": {"micro_batch": 8, "accumulation": 2}}))
    p = subprocess.run([python(), str(TRAINERS / "oom_lightning.py"), str(cfg), str(ckpt)], env=d.env(),
                       capture_output=True, text=True, timeout=180)
    assert p.returncode != 0 and "OutOfMemoryError" in p.stderr, p.stderr[-3000:]
    assert ckpt.exists(), "no checkpoint saved at the OOM"
    events = [e for e in d.events() if e.get("action") == "cuda_oom"]
    assert len(events) == 1 and "not recoverable in the step" in events[0]["detail"], events
    assert "micro-batch 4 × accumulation 4" in events[0]["detail"], events
    # The relaunch starts from the half micro-batch, with the effective batch kept.
    assert json.loads(cfg.read_text())["train"] == {"micro_batch": 4, "accumulation": 4}
