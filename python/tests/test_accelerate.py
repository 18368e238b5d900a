"""An accelerate script on `memwatch.accelerate.AcceleratedLoader`, against the real daemon in a real
memory cgroup: `accelerator.accumulate` steps the optimizer exactly at each window's end, before and
after memwatch's change, and the accelerator's accumulation follows the config."""

import pytest

pytest.importorskip("accelerate")

from scenario import CONFIG, GENERIC, assert_adapted, assert_exact_windows, under_pressure  # noqa: E402


def test_accelerate_runs_with_what_memwatch_asks(daemon_factory, cgroup_factory, tmp_path):
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, "accelerate_train.py", GENERIC, "accelerate")
    assert_exact_windows(run)
    assert_adapted(run)
    end = run.of("end")[0]
    assert end["epoch"] == 5 and end["global_step"] == end["max_steps"] == 5 * 32, end
    assert end["scheduler_steps"] == end["max_steps"] and end["lr"] == pytest.approx(0.0), end
