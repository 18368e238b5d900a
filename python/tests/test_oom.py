"""An out-of-memory error inside a step costs that step, not the run: `AdaptiveLoader.backward`
with a model that raises the real `torch.OutOfMemoryError` past a budget (trainers/oom_model.py).

Every recovered run is compared with a reference run that started at the smaller micro-batch and
never ran out of memory: the same samples in the same order, and the same weights. The models are
float64; the runs differ only in how each micro-batch's mean is summed (one mean over 8 samples, or
two over 4 each weighted a half), so the weights agree to rounding: rtol 1e-10, atol 1e-12 after
every optimizer step of 2 epochs (float64's epsilon is 2.2e-16)."""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch

from conftest import TRAINERS

sys.path.insert(0, str(TRAINERS))
import oom_model  # noqa: E402
from oom_model import Budgeted, Indexed, mse, weights  # noqa: E402

import memwatch.oom  # noqa: E402
from memwatch.pytorch import AdaptiveLoader  # noqa: E402

TOLERANCE = dict(rtol=1e-10, atol=1e-12)


def train(
    micro: int,
    accumulation: int,
    *,
    epochs: int = 2,
    n: int = 64,
    budget: Optional[Callable[[Budgeted, int], None]] = None,
    min_micro_batch: int = 1,
    checkpoint: Optional[Callable[[Dict[str, Any]], None]] = None,
) -> Dict[str, Any]:
    """Trains Budgeted on Indexed(n) with SGD; `budget(model, micro_batches_so_far)` may change the
    model's budgets before each micro-batch. Returns the weights after every optimizer step, the
    samples handed out in order, and the loader."""
    model = Budgeted()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = AdaptiveLoader(
        Indexed(n), None, batch_size=micro, accumulation=accumulation, seed=3, min_micro_batch=min_micro_batch,
        checkpoint=checkpoint,
    )
    steps: List[List[torch.Tensor]] = []
    handed: List[int] = []
    count = 0
    for _ in range(epochs):
        for batch in loader:
            if budget is not None:
                budget(model, count)
            count += 1
            handed.extend(int(i) for i in batch[2])
            loader.backward(model, batch, lambda b: mse(model, b))
            if loader.sync:
                opt.step()
                opt.zero_grad()
                steps.append(weights(model))
    return {"steps": steps, "handed": handed, "loader": loader, "model": model}


def assert_same_run(got: Dict[str, Any], reference: Dict[str, Any]) -> None:
    assert got["handed"] == reference["handed"], "the samples were not handed out in the same order"
    assert len(got["steps"]) == len(reference["steps"]), "a different number of optimizer steps"
    for i, (a, b) in enumerate(zip(got["steps"], reference["steps"])):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, **TOLERANCE, msg=lambda m: f"optimizer step {i + 1}: {m}")


def test_a_forward_oom_mid_window_reruns_the_same_samples_at_half_and_the_run_stays_exact():
    def from_the_third(model: Budgeted, k: int) -> None:
        model.forward_budget = 4 if k >= 2 else None  # a second job takes the GPU mid-epoch

    got = train(8, 2, budget=from_the_third)
    reference = train(4, 4)
    assert_same_run(got, reference)
    loader = got["loader"]
    assert (loader.micro_batch, loader.accumulation) == (4, 4)
    assert [(o.phase, o.micro_batch_before, o.micro_batch_after, o.recovered) for o in loader.ooms] == [
        ("forward", 8, 4, True)
    ]
    assert got["model"].ooms == [("forward", 8)], "the OOM came once: every later micro-batch ran at 4"
    assert loader.ooms[0].figures["requested_bytes"] == 2 << 30


def test_a_backward_oom_after_part_of_the_gradient_accumulated_rolls_the_window_back():
    def second_of_a_window(model: Budgeted, k: int) -> None:
        # Micro-batch 5 is the second of the third window: the first of that window has added its
        # gradient, and the failing backward pass has added the last layer's part of its own.
        model.backward_budget = 4 if k >= 5 else None

    got = train(8, 2, budget=second_of_a_window)
    reference = train(4, 4)
    assert_same_run(got, reference)
    assert [(o.phase, o.micro_batch_after) for o in got["loader"].ooms] == [("backward", 4)]
    assert got["model"].ooms == [("backward", 8)]


def test_a_half_that_fails_again_is_halved_again():
    got = train(8, 2, budget=lambda m, k: setattr(m, "forward_budget", 2))
    assert_same_run(got, train(2, 8))
    assert [(o.micro_batch_before, o.micro_batch_after) for o in got["loader"].ooms] == [(8, 4), (4, 2)]


def test_an_oom_at_the_floor_saves_a_checkpoint_at_the_windows_start_and_stops_without_looping():
    saved: List[Dict[str, Any]] = []

    def later(model: Budgeted, k: int) -> None:
        model.forward_budget = 2 if k >= 5 else None

    with pytest.raises(memwatch.oom.AtFloor) as e:
        train(8, 2, budget=later, min_micro_batch=4, checkpoint=saved.append)
    assert "min_micro_batch" in str(e.value)
    assert len(saved) == 1, "one checkpoint, then the run stops"
    state = saved[0]
    # Micro-batch 5 is the second of the third window: the window began at sample 32.
    assert (state["epoch"], state["position"]) == (0, 32)
    assert state["oom_micro_batch"] == 4

    # The relaunch resumes from the window's start at the micro-batch the run reached.
    fresh = AdaptiveLoader(Indexed(64), None, batch_size=8, accumulation=2, seed=3, min_micro_batch=4)
    fresh.load_state_dict(state)
    assert (fresh.micro_batch, fresh.accumulation, fresh.position) == (4, 4, 32)
    first = next(iter(fresh))
    reference = train(4, 4, epochs=1)["handed"]
    assert [int(i) for i in first[2]] == reference[32:36]


def test_other_errors_are_not_taken_for_out_of_memory():
    model = Budgeted()
    loader = AdaptiveLoader(Indexed(16), None, batch_size=8, accumulation=1)

    def broken(b: Any) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        for batch in loader:
            loader.backward(model, batch, broken)
    assert loader.ooms == []


def test_the_oom_message_gives_the_bytes_asked_for():
    assert memwatch.oom.requested_bytes(oom_model.MESSAGE) == 2 << 30
    assert memwatch.oom.requested_bytes("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024 bytes") == 1024
    assert memwatch.oom.requested_bytes("CUDA out of memory.") is None
    assert memwatch.oom.is_oom(torch.OutOfMemoryError("x"))
    assert not memwatch.oom.is_oom(RuntimeError("out of range"))


def test_halving_keeps_the_accumulation_whole():
    assert memwatch.oom.smaller(8, 16, 1) == 4
    assert memwatch.oom.smaller(6, 12, 1) == 3
    assert memwatch.oom.smaller(5, 10, 1) == 2
    assert memwatch.oom.smaller(4, 8, 4) is None
    assert memwatch.oom.smaller(1, 8, 1) is None


# --- DDP: two gloo ranks, the OOM on one ---------------------------------------------------------


def _ddp(tmp_path, case: str, micro: int, accumulation: int) -> Dict[str, Any]:
    import json
    import subprocess

    from conftest import python

    out = tmp_path / case
    out.mkdir()
    p = subprocess.run(
        [python(), str(TRAINERS / "oom_ddp.py"), str(out), case, str(micro), str(accumulation)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    ended = json.loads(p.stdout.strip().splitlines()[-1])
    ranks = [torch.load(out / f"rank{r}.pt") for r in (0, 1)] if ended["ended"] == "finished" else []
    checkpoint = torch.load(out / "checkpoint.pt") if (out / "checkpoint.pt").exists() else None
    return {"ended": ended, "ranks": ranks, "checkpoint": checkpoint, "log": p.stderr}


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    return _ddp(tmp_path_factory.mktemp("ddp-reference"), "reference", 4, 4)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_an_oom_on_one_ddp_rank_is_recovered_on_every_rank_from_the_same_step(tmp_path, ddp_reference, phase):
    got = _ddp(tmp_path, phase, 8, 2)
    assert got["ended"]["ended"] == "finished", got["ended"]
    ref = ddp_reference["ranks"]
    r0, r1 = got["ranks"]
    assert r0["shapes"] == r1["shapes"], "the ranks ran different micro-batches at some optimizer step"
    assert [8, 2] in r0["shapes"] and r0["shapes"][-1] == [4, 4]
    assert [o[:3] for o in r1["ooms"]] == [(phase, 8, 4)] and r1["ooms"][0][3], "rank 1 ran out of memory"
    assert [o[:3] for o in r0["ooms"]] == [(phase, 8, 4)] and not r0["ooms"][0][3], "rank 0 followed"
    for rank, (mine, theirs) in enumerate(zip(got["ranks"], ref)):
        assert_same_run(mine, theirs)
    for a, b in zip(r0["steps"][-1], r1["steps"][-1]):
        assert torch.equal(a, b), "DDP's ranks ended with different weights"


def test_an_oom_in_a_ddp_backward_pass_that_syncs_saves_a_checkpoint_and_ends_every_rank(tmp_path):
    got = _ddp(tmp_path, "synced", 8, 1)
    ended = got["ended"]
    assert ended["ended"] == "raised" and "AtFloor" in ended["error"], ended
    # Ended by the launcher when rank 1 raised, not by gloo's collective timeout (600 s) on rank 0.
    assert ended["seconds"] < 120, ended
    state = got["checkpoint"]["loader"]
    # The 5th micro-batch of 8 is the first of epoch 1 on each rank (32 samples a rank an epoch).
    assert (state["epoch"], state["position"], state["oom_micro_batch"]) == (1, 0, 4)
