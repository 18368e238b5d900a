"""transformers.Trainer with `callbacks=[MemwatchCallback()]`, against the real daemon in a real memory
cgroup: the changes memwatch stages are applied for real and the Trainer's own counters stay right,
also for a job named by hand in `MEMWATCH_JOB`; the naive callback the protocol doc leads to is caught
by memwatch's verification; a run that takes itself for launched while no job is attached stops at
its start with what to fix."""

import json
import os
import subprocess

import pytest

pytest.importorskip("transformers")

from conftest import MIB, TRAINERS, eventually, python  # noqa: E402
from scenario import CONFIG, HF, Run, assert_adapted, assert_exact_windows, read, under_pressure  # noqa: E402

STEPS_PER_EPOCH = 512 // 16


def test_the_trainer_runs_with_what_memwatch_asks_and_its_counters_stay_right(daemon_factory, cgroup_factory, tmp_path):
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, "hf_train.py", HF, "hf", ["memwatch"])
    assert_exact_windows(run)
    assert_adapted(run)
    # The Trainer's own epoch, step and schedule: 5 epochs of 32 optimizer steps, each epoch ending
    # on a whole number, and the linear schedule run to its end.
    end = run.of("end")[0]
    assert end["global_step"] == end["max_steps"] == 5 * STEPS_PER_EPOCH, end
    assert end["epoch"] == pytest.approx(5.0), end
    assert end["scheduler_steps"] == end["max_steps"], end
    assert end["lr"] == pytest.approx(0.0, abs=1e-12), end
    epochs = [r["epoch"] for r in run.of("epoch")]
    assert epochs == sorted(epochs), "the epoch counter went backwards"
    for r in run.of("epoch"):
        if r["global_step"] % STEPS_PER_EPOCH == 0:
            assert r["epoch"] == pytest.approx(r["global_step"] // STEPS_PER_EPOCH), r


def test_a_job_named_by_hand_in_MEMWATCH_JOB_is_attached_and_adapted(daemon_factory, cgroup_factory, tmp_path):
    """docs/python.md names the job with `MEMWATCH_JOB`: set by hand, with no `memwatch launch`, the
    callback attaches the run itself under that name, and the run is adapted as any other."""
    d = daemon_factory(CONFIG)
    env = {"MEMWATCH_JOB": "hf-rewrite"}
    run = under_pressure(d, cgroup_factory(), tmp_path, "hf_train.py", HF, "hf-rewrite", ["by-env"], env=env)
    assert run.job["name"] == "hf-rewrite" and run.job.get("launch") is None, run.job
    assert_exact_windows(run)
    assert_adapted(run)
    applied = [x["applied_epoch"] for x in run.directives()]
    assert applied and applied[0] == 1, run.directives()


def test_a_launch_marker_with_no_job_attached_stops_the_run_at_its_start(daemon_factory, tmp_path):
    """`MEMWATCH_LAUNCHED` names an ancestor (as `memwatch launch` would) but no job by the name is
    attached: the callback raises MemwatchError before the first step, saying what to fix, rather than
    training on unattached with a warning."""
    d = daemon_factory(CONFIG)
    cfg, out, go = tmp_path / "train.json", tmp_path / "out.jsonl", tmp_path / "go"
    # One short epoch with its gates open: a run that trained on unattached would end, with 0.
    cfg.write_text(json.dumps(dict(HF, num_train_epochs=1, dataloader_num_workers=0)))
    go.touch()
    (tmp_path / "go.done").touch()
    env = dict(os.environ, **d.env(), MEMWATCH_JOB="hf-ghost", MEMWATCH_LAUNCHED=str(os.getpid()))
    p = subprocess.run(
        [python(), str(TRAINERS / "hf_train.py"), str(cfg), str(out), str(go), str(tmp_path / "output"), "by-env"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode != 0, p.stderr[-3000:]
    assert "memwatch.client.MemwatchError: memwatch has no attached job named 'hf-ghost'" in p.stderr, p.stderr[-3000:]
    assert "MEMWATCH_LAUNCHED says `memwatch launch` attached this run" in p.stderr, p.stderr[-3000:]
    assert not [r for r in read(out) if r["kind"] in ("ready", "step")], read(out)
    assert d.job("hf-ghost") is None


def test_the_naive_callback_is_caught_and_memwatchs_is_not(daemon_factory, cgroup_factory, tmp_path):
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, "hf_train.py", HF, "hf", ["naive"], gpu=False)
    workers = [x for x in run.directives() if any(c["knob"] == "workers" for c in x["changes"])]
    assert workers, run.directives()
    assert workers[0]["verification"]["state"] == "unverified", workers[0]
    live = [w["live"] for w in run.of("workers")]
    assert live[-1] == 4, f"the naive callback changed the workers after all: {live}"
    assert any(e["action"] == "unverified" for e in run.events), run.events[-5:]
    # The job has ended by now (its per-job series with it); the intervention counter stays. /metrics
    # shows the view the daemon published, which may come a moment after what the socket answered.
    counter = 'memwatch_interventions_total{action="unverified"'
    eventually(30, lambda: counter in d.metrics(), lambda: f"{counter} not in /metrics:\n{d.metrics()}")
