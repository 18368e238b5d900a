"""transformers.Trainer with `callbacks=[MemwatchCallback()]`, against the real daemon in a real memory
cgroup: the changes memwatch stages are applied for real and the Trainer's own counters stay right;
the naive callback the protocol doc leads to is caught by memwatch's verification."""

import pytest

pytest.importorskip("transformers")

from conftest import MIB, eventually  # noqa: E402
from scenario import CONFIG, Run, assert_adapted, assert_exact_windows, under_pressure  # noqa: E402

HF = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "dataloader_num_workers": 4,
    "dataloader_pin_memory": True,
    "num_train_epochs": 5,
}
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
