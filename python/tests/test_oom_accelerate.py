"""An out-of-memory error inside an accelerate step costs that step, not the run:
`AcceleratedLoader.backward` inside `accelerator.accumulate`, compared with a run that started at
the smaller micro-batch (float64; rtol 1e-10, atol 1e-12, as in test_oom.py)."""

from __future__ import annotations

import sys
from typing import Any, Dict, List

import torch

from conftest import TRAINERS

import accelerate  # noqa: E402  (pinned in requirements-test.txt: a missing one fails, never skips)

sys.path.insert(0, str(TRAINERS))
from oom_model import Budgeted, Indexed, mse, weights  # noqa: E402

from memwatch.accelerate import AcceleratedLoader  # noqa: E402


def train(micro: int, accumulation: int, oom_from: int = -1) -> Dict[str, Any]:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = Budgeted()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    loader = AcceleratedLoader(accelerator, Indexed(64), None, batch_size=micro, accumulation=accumulation, seed=3)
    steps: List[List[torch.Tensor]] = []
    handed: List[int] = []
    count = 0
    for _ in range(2):
        for batch in loader:
            if 0 <= oom_from <= count:
                model.forward_budget = micro // 2
            count += 1
            handed.extend(int(i) for i in batch[2])
            with accelerator.accumulate(model):
                loader.backward(model, batch, lambda b: mse(model, b))
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                assert loader.sync, "accelerate stepped inside a window"
                steps.append(weights(model))
    return {"steps": steps, "handed": handed, "loader": loader}


def test_an_accelerate_run_recovers_in_the_step_and_ends_where_a_run_at_half_would():
    got = train(8, 2, oom_from=2)
    reference = train(4, 4)
    assert got["handed"] == reference["handed"]
    assert len(got["steps"]) == len(reference["steps"])
    for a, b in zip(got["steps"], reference["steps"]):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)
    loader = got["loader"]
    assert [(o.phase, o.micro_batch_before, o.micro_batch_after) for o in loader.ooms] == [("forward", 8, 4)]
    assert (loader.micro_batch, loader.accumulation) == (4, 4)
