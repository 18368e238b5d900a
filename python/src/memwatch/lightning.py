"""Lightning: one line, `Trainer(..., callbacks=[MemwatchCallback()])`.

At the end of an epoch with a change pending, the callback sets the datamodule's (or, without one, the
LightningModule's) `batch_size`, `num_workers` and `pin_memory` (attribute or `hparams` entry; the
names are configurable) and the Trainer's `accumulate_grad_batches`, and has Lightning reload the train
DataLoader for the next epoch: `train_dataloader()` must build it from those attributes. Micro-batch ×
accumulation is kept, so the optimizer steps per epoch, `global_step` and a schedule sized from
`estimated_stepping_batches` stay right.

In a job of several processes (DDP: `trainer.world_size` > 1), the ranks settle each change
together at the epoch's end, so that every rank takes the same batch size and accumulation whichever
rank's memwatch asked (`_ranks`, docs/python.md).

A CUDA out-of-memory error inside a step cannot be recovered in the step: Lightning's automatic
optimization runs forward and backward inside its own loop, and no public hook can run a batch again
as halves. The callback takes the way out instead (`on_exception`): it saves a checkpoint (the
weights of the last optimizer step, with Lightning's loop state), tells memwatch the OOM and the half
micro-batch to relaunch at, and lets the error end the run, for `memwatch launch` to relaunch from the
checkpoint (docs/python.md, "CUDA out of memory").

Nothing changes mid-epoch. When memwatch asks for a checkpoint the callback saves one with
`trainer.save_checkpoint` (to `checkpoint_path`, default `<default_root_dir>/memwatch.ckpt`) and tells
memwatch, which stops the job cleanly; relaunched by `memwatch launch` (`MEMWATCH_RESUME=1`), pass that
path as `ckpt_path` to `fit`.

Tested with lightning 2.6.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Mapping, Optional, Sequence

from lightning.pytorch.callbacks import Callback

from . import _proc, _ranks, oom
from .client import ACCUMULATION, MICRO_BATCH, PIN_MEMORY, WORKERS, Client

log = logging.getLogger("memwatch")

DEFAULT_ATTRIBUTES = {MICRO_BATCH: "batch_size", WORKERS: "num_workers", PIN_MEMORY: "pin_memory"}


class MemwatchCallback(Callback):
    """Adapts a Lightning run to what memwatch asks.

    client: the run's `memwatch.Client` [default: one for `config_file`, or the job `memwatch launch`
    attached]. attributes: where the DataLoader's knobs live on the datamodule or module.
    """

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        config_file: Optional[str] = None,
        profile: Optional[str] = None,
        keys: Sequence[str] = (),
        name: Optional[str] = None,
        attributes: Mapping[str, str] = DEFAULT_ATTRIBUTES,
        checkpoint_path: Optional[str] = None,
        report_seconds: float = 2.0,
    ) -> None:
        self.client = client or Client(name, config_file=config_file, profile=profile, keys=keys)
        self.attributes = dict(attributes)
        self.checkpoint_path = checkpoint_path
        self.report_seconds = report_seconds
        self.applied: list = []
        """(generation, epoch, values) for each change applied."""
        self._reload: Optional[int] = None
        self._checkpointed = False
        self._last_report = float("-inf")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.client.attach()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._reload is not None:  # the DataLoader was reloaded before this hook
            trainer.reload_dataloaders_every_n_epochs = self._reload
            self._reload = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        d = self.client.directives(force=True)
        mine = d if d is not None and d.pending else None
        dist = _ranks.distributed(trainer.world_size)
        if dist is None:
            if mine is not None:
                self._apply(trainer, pl_module, mine.new_values(), mine.generation, trainer.current_epoch + 1)
            return
        # Every rank at the same boundary takes the same micro-batch (docs/python.md).
        micro = _get(_target(trainer, pl_module), self.attributes.get(MICRO_BATCH))
        if not isinstance(micro, int):
            why = "the micro-batch attribute is not found, so the ranks cannot settle a change"
            if mine is not None:
                log.error("memwatch: %s", why)
                self.client.cannot_apply(mine.generation, why)
            return
        s = _ranks.settled(self.client, dist, mine, micro, micro * trainer.accumulate_grad_batches)
        if s is not None:
            self._apply(trainer, pl_module, s.new, s.generation, trainer.current_epoch + 1)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """An out-of-memory error ends the step and the run: a checkpoint, and memwatch told."""
        if not oom.is_oom(exception):
            return
        message = str(exception).split("\n")[0]
        phase = "backward" if _in_backward(exception) else "forward"
        target = _target(trainer, pl_module)
        micro = _get(target, self.attributes.get(MICRO_BATCH))
        path = self.checkpoint_path or os.path.join(trainer.default_root_dir, "memwatch.ckpt")
        saved = False
        try:
            trainer.save_checkpoint(path)
            saved = True
            log.error("memwatch: out of memory in the %s pass; checkpoint saved to %s", phase, path)
        except Exception as e:  # the OOM is what the user must see; a failed save is logged
            log.error("memwatch: out of memory in the %s pass, and the checkpoint failed: %s", phase, e)
        report: Dict[str, Any] = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "phase": phase,
            "recovered": False,
            "checkpointed": saved,
            "message": message[:500],
        }
        if isinstance(micro, int):
            report["micro_batch_before"] = micro
            half = oom.smaller(micro, micro * trainer.accumulate_grad_batches, 1)
            if half is not None:
                report["micro_batch_after"] = half
                report["accumulation_after"] = micro * trainer.accumulate_grad_batches // half
        report.update({k: v for k, v in oom.cuda_figures(message, None).items() if v is not None})
        if trainer.world_size > 1:
            report.update(rank=trainer.global_rank, world_size=trainer.world_size)
        self.client.oom(report)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        d = self.client.directives()
        if d is not None and d.checkpoint_requested and not self._checkpointed:
            path = self.checkpoint_path or os.path.join(trainer.default_root_dir, "memwatch.ckpt")
            log.info("memwatch asks for a checkpoint: saving %s", path)
            trainer.save_checkpoint(path)
            self._checkpointed = self.client.checkpoint_saved()
        if time.monotonic() - self._last_report >= self.report_seconds:
            self._last_report = time.monotonic()
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
            self.client.progress(
                trainer.current_epoch,
                trainer.global_step,
                loss=float(loss) if loss is not None else None,
                running=self.running(trainer, pl_module),
            )

    def running(self, trainer: Any, pl_module: Any) -> Dict[str, Any]:
        """What the run uses now (workers counted live)."""
        target = _target(trainer, pl_module)
        out: Dict[str, Any] = {WORKERS: _proc.live_workers(), ACCUMULATION: trainer.accumulate_grad_batches}
        for knob in (MICRO_BATCH, PIN_MEMORY):
            v = _get(target, self.attributes.get(knob))
            if v is not None:
                out[knob] = v
        return out

    def _apply(
        self, trainer: Any, pl_module: Any, new: Dict[str, Any], generation: Optional[int], epoch: int
    ) -> None:
        """Takes `new` (the knobs' new values) from `epoch` on; acknowledges `generation`, this
        process's own directives (None: another rank's memwatch asked, and this rank follows)."""
        target = _target(trainer, pl_module)
        micro_now = _get(target, self.attributes.get(MICRO_BATCH))
        if MICRO_BATCH in new or ACCUMULATION in new:
            micro = int(new.get(MICRO_BATCH, micro_now or 0))
            accumulation = int(new.get(ACCUMULATION, trainer.accumulate_grad_batches))
            if micro_now is None or micro * accumulation != micro_now * trainer.accumulate_grad_batches:
                why = (
                    f"cannot keep the effective batch: {type(target).__name__}.{self.attributes.get(MICRO_BATCH)} "
                    f"is {micro_now!r}, accumulation {trainer.accumulate_grad_batches}; asked {micro} × {accumulation}"
                )
                log.error("memwatch: %s", why)
                if generation is not None:
                    self.client.cannot_apply(generation, why)
                return
        missing = [k for k in new if k != ACCUMULATION and _get(target, self.attributes.get(k)) is None]
        if missing:
            why = f"{type(target).__name__} has no attribute for {', '.join(missing)} (set `attributes`)"
            log.error("memwatch: %s", why)
            if generation is not None:
                self.client.cannot_apply(generation, why)
            return
        values: Dict[str, Any] = {}
        for knob, v in new.items():
            if knob == ACCUMULATION:
                trainer.accumulate_grad_batches = int(v)
            else:
                v = bool(v) if knob == PIN_MEMORY else int(v)
                _set(target, self.attributes[knob], v)
            values[knob] = v
        if self._reload is None:
            self._reload = trainer.reload_dataloaders_every_n_epochs
        trainer.reload_dataloaders_every_n_epochs = 1
        log.info("memwatch: generation %s applied from epoch %d: %s", generation, epoch, values)
        self.applied.append((generation, epoch, values))
        if generation is not None:
            self.client.ack(generation, epoch)
        self._last_report = float("-inf")


def _in_backward(e: BaseException) -> bool:
    """Whether the error was raised inside a backward pass (a `backward` frame on its way)."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("backward", "_engine_run_backward"):
            return True
        tb = tb.tb_next
    return False


def _target(trainer: Any, pl_module: Any) -> Any:
    return getattr(trainer, "datamodule", None) or pl_module


def _get(obj: Any, attr: Optional[str]) -> Any:
    if attr is None:
        return None
    if hasattr(obj, attr):
        return getattr(obj, attr)
    hp = getattr(obj, "hparams", None)
    return hp.get(attr) if isinstance(hp, Mapping) else None


def _set(obj: Any, attr: str, value: Any) -> None:
    if hasattr(obj, attr):
        setattr(obj, attr, value)
    hp = getattr(obj, "hparams", None)
    if isinstance(hp, Mapping) and attr in hp:
        hp[attr] = value  # type: ignore[index]
