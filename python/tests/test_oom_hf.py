"""An out-of-memory error inside a Hugging Face `Trainer` step costs that step, not the run:
`MemwatchCallback` guards the Trainer's `training_step`. A recovered run ends with the same weights
as a run that started at the smaller per-device batch (float64; rtol 1e-10, atol 1e-12, as in
test_oom.py), and moves to that batch from the next epoch."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional

import pytest
import torch

from conftest import TRAINERS

import transformers  # noqa: E402  (pinned in requirements-test.txt: a missing one fails, never skips)

sys.path.insert(0, str(TRAINERS))
from oom_model import Budgeted, Indexed  # noqa: E402

import memwatch  # noqa: E402
import memwatch.hf  # noqa: E402
import memwatch.oom  # noqa: E402


class Model(Budgeted):
    """Budgeted as a Trainer takes it: keyword inputs, a dict with the loss."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor, idx: Optional[torch.Tensor] = None) -> Dict[str, Any]:  # type: ignore[override]
        out = super().forward(x, idx)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Samples(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.inner = Indexed(64)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        x, y, idx = self.inner[i]
        return {"x": x, "labels": y, "idx": idx}


class Budget(transformers.TrainerCallback):
    """Sets the model's budgets from the `after`-th micro-batch on (counted at each training step)."""

    def __init__(self, model: Model, after: int, forward: Optional[int], backward: Optional[int]) -> None:
        self.model, self.after, self.forward, self.backward = model, after, forward, backward
        self.count = 0

    def on_substep_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._tick()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._tick()

    def _tick(self) -> None:
        self.count += 1
        if self.count >= self.after:
            self.model.forward_budget, self.model.backward_budget = self.forward, self.backward


def train(tmp_path, micro: int, accumulation: int, budget: Optional[Dict[str, Any]] = None, **callback: Any):
    model = Model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / f"out-{micro}-{accumulation}-{bool(budget)}"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=2,
        learning_rate=0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        seed=0,
        data_seed=3,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    down = memwatch.Client("hf-oom", socket_path=str(tmp_path / "no.sock"), url="http://127.0.0.1:9")
    mw = memwatch.hf.MemwatchCallback(down, **callback)
    callbacks: List[Any] = [mw]
    if budget is not None:
        callbacks.append(Budget(model, **budget))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Samples(), callbacks=callbacks)
    trainer.train()
    return {"model": model, "trainer": trainer, "callback": mw}


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x.detach(), y.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_the_trainer_recovers_in_the_step_and_ends_where_a_run_at_half_would(tmp_path, phase):
    budget = {"after": 3, "forward": 4 if phase == "forward" else None, "backward": 4 if phase == "backward" else None}
    got = train(tmp_path, 8, 2, budget)
    reference = train(tmp_path, 4, 4)
    assert_same_weights(got["model"], reference["model"])
    if phase == "forward":
        assert got["model"].seen == reference["model"].seen, "the samples were not trained on in the same order"
    assert [(o.phase, o.micro_batch_before, o.micro_batch_after) for o in got["callback"].ooms] == [(phase, 8, 4)]
    assert got["model"].ooms == [(phase, 8)], "one OOM: the rest of the epoch ran as halves"
    args = got["trainer"].args
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 4)
    assert got["trainer"].state.global_step == reference["trainer"].state.global_step


def test_at_the_floor_the_trainer_saves_a_checkpoint_and_stops(tmp_path):
    with pytest.raises(memwatch.oom.AtFloor):
        train(tmp_path, 8, 2, {"after": 3, "forward": 2, "backward": None}, min_micro_batch=4)
    saved = list((tmp_path / "out-8-2-True").glob("checkpoint-*"))
    assert [p.name for p in saved] == ["checkpoint-1"], "one checkpoint, of the one optimizer step done"
    assert (saved[0] / "trainer_state.json").exists()
