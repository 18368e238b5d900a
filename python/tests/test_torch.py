"""A plain PyTorch loop on `memwatch.pytorch.AdaptiveLoader`, against the real daemon in a real memory
cgroup: the DataLoader is rebuilt with what memwatch asks, every optimizer step sees exactly
micro × accumulation samples, and the loop's own counters stay right."""

import pytest

pytest.importorskip("torch")

from scenario import CONFIG, GENERIC, assert_adapted, assert_exact_windows, under_pressure  # noqa: E402


def test_the_loader_is_rebuilt_with_what_memwatch_asks(daemon_factory, cgroup_factory, tmp_path):
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, "torch_train.py", GENERIC, "torch")
    assert_exact_windows(run)
    assert_adapted(run)
    end = run.of("end")[0]
    assert end["epoch"] == 5 and end["global_step"] == end["max_steps"] == 5 * 32, end
    assert end["scheduler_steps"] == end["max_steps"] and end["lr"] == pytest.approx(0.0), end
