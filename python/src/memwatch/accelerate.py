"""accelerate (`accelerate launch` scripts).

- `gradient_accumulation_plugin(client)`: the accumulation from the config file memwatch manages, for
  `Accelerator(gradient_accumulation_plugin=…)`.
- `deepspeed_plugin(config_file)`: with the `deepspeed` profile, the DeepSpeed config memwatch manages,
  for `Accelerator(deepspeed_plugin=…)`; it is read once, at the start.
- `AcceleratedLoader(accelerator, dataset, client, …)`: memwatch's `AdaptiveLoader` with each DataLoader
  prepared by the accelerator and the accelerator's accumulation kept to each window, so that
  `with accelerator.accumulate(model):` steps the optimizer exactly at the window's end, also after
  a change mid-run. Under DeepSpeed the engine fixes micro-batch and accumulation at its start: those
  changes are declined (they apply at the next start, from the rewritten file); workers and
  pin_memory still change.

`loader.backward(model, batch, loss_of)` inside `with accelerator.accumulate(model):` runs the
backward pass through `accelerator.backward` and makes a CUDA out-of-memory error cost the step, not
the run, as `AdaptiveLoader.backward` does (`memwatch.oom`). Under DeepSpeed the engine counts its
own micro-steps, so a micro-batch is never split: an OOM there saves a checkpoint and stops.

Tested with accelerate 1.15.
"""

from __future__ import annotations

from typing import Any, Optional

from .client import ACCUMULATION, Client
from .pytorch import AdaptiveLoader


def gradient_accumulation_plugin(client: Optional[Client] = None, default: int = 1) -> Any:
    """A `GradientAccumulationPlugin` with the config's accumulation (or `default`). It does not
    sync with the DataLoader's end: `AcceleratedLoader` ends its windows itself. It attaches the
    client first (`Client.attach`: a refusal raises `MemwatchError`)."""
    from accelerate.utils import GradientAccumulationPlugin

    steps = default
    if client is not None:
        client.attach()  # a refusal raises MemwatchError here, before the Accelerator is built
    d = client.directives(force=True) if client is not None else None
    if d is not None and ACCUMULATION in d.knobs:
        steps = int(d.knobs[ACCUMULATION])
    return GradientAccumulationPlugin(num_steps=steps, sync_with_dataloader=False)


def deepspeed_plugin(config_file: str) -> Any:
    """A `DeepSpeedPlugin` reading the DeepSpeed config memwatch manages (profile `deepspeed`)."""
    from accelerate.utils import DeepSpeedPlugin

    return DeepSpeedPlugin(hf_ds_config=config_file)


class AcceleratedLoader(AdaptiveLoader):
    """`AdaptiveLoader` for an `accelerate.Accelerator`."""

    def __init__(self, accelerator: Any, dataset: Any, client: Optional[Client] = None, **kwargs: Any) -> None:
        self.accelerator = accelerator
        kwargs.setdefault("rank", accelerator.process_index)
        kwargs.setdefault("world_size", accelerator.num_processes)
        # Each rank reads its own share already: accelerate must not shard it again.
        super().__init__(dataset, client, prepare=self._prepare, **kwargs)

    def _prepare(self, loader: Any) -> Any:
        from accelerate.data_loader import DataLoaderShard

        return DataLoaderShard(
            loader.dataset,
            device=self.accelerator.device,
            batch_size=loader.batch_size,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            collate_fn=loader.collate_fn,
        )

    def _window_start(self) -> None:
        self.accelerator.gradient_accumulation_steps = self.window
        self.accelerator.step = 0

    def _scale(self) -> float:
        # accelerator.backward divides by its accumulation, which `_window_start` keeps the window's.
        return 1.0

    def _backward_pass(self, loss: Any) -> None:
        self.accelerator.backward(loss)

    def _floor(self) -> int:
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
            return self.micro_batch
        return super()._floor()

    def _check(self, micro: int, accumulation: int) -> Optional[str]:
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.DEEPSPEED and (
            micro != self.micro_batch or accumulation != self.accumulation
        ):
            return "DeepSpeed fixes micro-batch and accumulation at its start; they apply at the next start"
        return super()._check(micro, accumulation)
