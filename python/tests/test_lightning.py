"""Lightning with `callbacks=[MemwatchCallback()]`, against the real daemon in a real memory cgroup: the
datamodule's knobs and the Trainer's accumulation change at the next epoch, the DataLoader is reloaded,
and Lightning's epoch, global step and schedule stay right."""

import pytest

pytest.importorskip("lightning")

from scenario import CONFIG, GENERIC, assert_adapted, assert_exact_windows, under_pressure  # noqa: E402


def test_lightning_runs_with_what_memwatch_asks(daemon_factory, cgroup_factory, tmp_path):
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, "lightning_train.py", GENERIC, "lightning")
    assert_exact_windows(run)
    assert_adapted(run)
    end = run.of("end")[0]
    assert end["epoch"] == 5 and end["global_step"] == end["max_steps"] == 5 * 32, end
    assert end["scheduler_steps"] == end["max_steps"] and end["lr"] == pytest.approx(0.0), end
