"""A plain PyTorch loop on `memwatch.pytorch.AdaptiveLoader`, Lightning with
`callbacks=[MemwatchCallback()]`, and an accelerate script on `memwatch.accelerate.AcceleratedLoader`,
each against the real daemon in a real memory cgroup. The change memwatch stages is applied for real:
fewer live workers, and every optimizer step sees exactly micro-batch × accumulation samples, before
and after it. The loop's own epoch, global step and schedule stay right."""

import importlib.util

import pytest

from scenario import CONFIG, GENERIC, assert_adapted, assert_exact_windows, under_pressure

CASES = [
    ("torch", "torch_train.py", "torch"),
    ("lightning", "lightning_train.py", "lightning"),
    ("accelerate", "accelerate_train.py", "accelerate"),
]


@pytest.mark.parametrize("name,script,framework", CASES, ids=[c[0] for c in CASES])
def test_the_run_goes_on_with_what_memwatch_asks(daemon_factory, cgroup_factory, tmp_path, name, script, framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    d = daemon_factory(CONFIG)
    run = under_pressure(d, cgroup_factory(), tmp_path, script, GENERIC, name)
    assert_exact_windows(run)
    assert_adapted(run)
    end = run.of("end")[0]
    assert end["epoch"] == 5 and end["global_step"] == end["max_steps"] == 5 * 32, end
    assert end["scheduler_steps"] == end["max_steps"] and end["lr"] == pytest.approx(0.0), end
