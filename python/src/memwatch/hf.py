"""The Hugging Face `Trainer`: one line, `Trainer(..., callbacks=[MemwatchCallback()])`.

What it changes, at the next epoch boundary: DataLoader workers, pin_memory, the per-device batch and
gradient accumulation. It rebuilds the train DataLoader through the Trainer's own
`get_train_dataloader()` (so sampler, collator and accelerate's wrapping stay the Trainer's), shuts
the old one's workers down, and hands the Trainer's epoch loop the new DataLoader and its length, so
that the epoch counter, the global step and the learning-rate schedule stay right (micro-batch ×
accumulation is kept, so the optimizer steps per epoch do not change).

Setting `num_workers` on the DataLoader a callback is handed changes nothing (accelerate's
`DataLoaderShard` wraps the real one, and the Trainer already measured the epoch): memwatch would
catch that as an unverified change.

In a job of several processes (DDP: `args.world_size` > 1 with torch.distributed up), the ranks
settle each change together at the epoch boundary, so that every rank takes the same per-device
batch and accumulation whichever rank's memwatch asked (`_ranks`, docs/python.md).

A CUDA out-of-memory error inside a step costs that step, not the run: the callback wraps the
Trainer's `training_step` (its public override point) so that the micro-batch that ran out runs again
as halves (`memwatch.oom`; with DDP, the ranks agree through `compute_loss`'s result, one small
all-reduce a piece), the rest of the epoch at that size, and from the next epoch on at half the
per-device batch with twice the accumulation. At the floor (`min_micro_batch`) it saves a checkpoint
through the Trainer and stops, for `memwatch launch` to relaunch with `resume_from_checkpoint`.

It cannot change anything mid-epoch: an urgent change (the job runs on emergency room) waits for the
epoch's end, and when memwatch asks for a checkpoint the callback saves one through the Trainer
(`should_save`) and tells memwatch, which stops the job cleanly (`memwatch launch` relaunches it with
the rewritten config; pass `resume_from_checkpoint=True` when `MEMWATCH_RESUME` is 1).

Tested with transformers 5.23; it needs a Trainer with `_run_epoch` (transformers 5), and otherwise
answers memwatch that it cannot apply changes mid-run.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from typing import Any, Dict, Optional, Sequence

from transformers import Trainer, TrainerCallback

from . import _proc, _ranks, oom
from .client import ACCUMULATION, MICRO_BATCH, PIN_MEMORY, WORKERS, Client

log = logging.getLogger("memwatch")


class MemwatchCallback(TrainerCallback):
    """Adapts a `transformers.Trainer` run to what memwatch asks.

    client: the run's `memwatch.Client` [default: one for `config_file` with the `hf` profile, or,
    under `memwatch launch`, the job launch attached].
    report_seconds: how often it reports progress and what it runs with.
    min_micro_batch: the smallest per-device batch an out-of-memory error halves down to.
    oom_snapshot_dir: where a CUDA memory snapshot is saved at an OOM (memory history on).
    """

    def __init__(
        self,
        client: Optional[Client] = None,
        *,
        config_file: Optional[str] = None,
        profile: str = "hf",
        keys: Sequence[str] = (),
        name: Optional[str] = None,
        report_seconds: float = 2.0,
        min_micro_batch: int = 1,
        oom_snapshot_dir: Optional[str] = None,
    ) -> None:
        self.client = client or Client(
            name, config_file=config_file, profile=profile if config_file else None, keys=keys
        )
        self.min_micro_batch = int(min_micro_batch)
        self.oom_snapshot_dir = oom_snapshot_dir
        self.ooms: list = []
        """Every out-of-memory error met in a step (`memwatch.oom.Oom`)."""
        self._guard: Optional[oom.Guard] = None
        self._fresh_window = True
        self.report_seconds = report_seconds
        self.trainer: Optional[Trainer] = None
        self.applied: list = []
        """(generation, epoch, values) for each change applied, for logs and tests."""
        self._replacement: Optional[Dict[str, Any]] = None
        self._checkpoint = "none"  # none → asked → saved
        self._last_report = float("-inf")
        self._loss: Optional[float] = None

    # --- Trainer events ------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._find_trainer()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._find_trainer()
        self.client.attach()
        if self.trainer is None or not hasattr(self.trainer, "_run_epoch"):
            log.warning(
                "memwatch: this transformers Trainer has no _run_epoch; changes apply at the next start only"
            )
            return
        self._guard_steps()
        if not getattr(self.trainer, "_memwatch_hooked", False):
            original = self.trainer._run_epoch

            def run_epoch(**kw: Any) -> Any:
                return original(**self._epoch_start(kw))

            self.trainer._run_epoch = run_epoch  # type: ignore[method-assign,assignment]
            self.trainer._memwatch_hooked = True  # type: ignore[attr-defined]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fresh_window = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        d = self.client.directives()
        if d is not None and d.checkpoint_requested and self._checkpoint == "none":
            log.info("memwatch asks for a checkpoint: saving one through the Trainer")
            control.should_save = True
            self._checkpoint = "asked"
        if d is not None and d.pending and not getattr(self.trainer, "_memwatch_hooked", False):
            self.client.cannot_apply(d.generation, "this transformers version cannot change the run mid-run")
        self._report(state)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._checkpoint == "asked" and self.client.checkpoint_saved():
            self._checkpoint = "saved"

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, float]] = None, **kw: Any) -> None:
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])

    # --- the epoch boundary --------------------------------------------------------------------

    def _epoch_start(self, kw: Dict[str, Any]) -> Dict[str, Any]:
        assert self.trainer is not None
        args = self.trainer.args
        d = self.client.directives(force=True)
        mine = d if d is not None and d.pending else None
        dist = _ranks.distributed(args.world_size)
        self._after_oom(kw)
        if dist is not None:
            # Every rank at the same boundary takes the same micro-batch (docs/python.md).
            micro = args.per_device_train_batch_size
            s = _ranks.settled(self.client, dist, mine, micro, micro * args.gradient_accumulation_steps)
            if s is not None:
                self._apply(s.new, s.generation, kw["epoch"], kw["train_dataloader"])
        elif mine is not None:
            self._apply(mine.new_values(), mine.generation, kw["epoch"], kw["train_dataloader"])
        if self._replacement is not None:
            kw.update(self._replacement)
        return kw

    def _apply(self, new: Dict[str, Any], generation: Optional[int], epoch: int, current: Any) -> None:
        """Takes `new` (the knobs' new values) from `epoch` on; acknowledges `generation`, this
        process's own directives (None: another rank's memwatch asked, and this rank follows)."""
        t = self.trainer
        assert t is not None
        args = t.args
        micro = int(new.get(MICRO_BATCH, args.per_device_train_batch_size))
        accumulation = int(new.get(ACCUMULATION, args.gradient_accumulation_steps))
        before = args.per_device_train_batch_size * args.gradient_accumulation_steps
        if micro * accumulation != before:
            why = f"micro-batch {micro} × accumulation {accumulation} is not the effective {before} per device"
            log.error("memwatch: %s; the change is not applied", why)
            if generation is not None:
                self.client.cannot_apply(generation, why)
            return
        values = {
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "dataloader_num_workers": int(new.get(WORKERS, args.dataloader_num_workers)),
            "dataloader_pin_memory": bool(new.get(PIN_MEMORY, args.dataloader_pin_memory)),
        }
        if any(getattr(args, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(args, k, v)
            t._train_batch_size = args.train_batch_size
            t.state.train_batch_size = args.train_batch_size
            old = self._replacement["train_dataloader"] if self._replacement else current
            _shut_down(old)
            loader = t.get_train_dataloader()
            _forget(t, old)
            steps = len(loader)
            self._replacement = {
                "train_dataloader": loader,
                "steps_in_epoch": steps,
                "num_update_steps_per_epoch": max(math.ceil(steps / accumulation), 1),
            }
            t.callback_handler.train_dataloader = loader
        log.info("memwatch: generation %s applied at epoch %d: %s", generation, epoch, values)
        self.applied.append((generation, epoch, values))
        if generation is not None:
            self.client.ack(generation, epoch)
        self._last_report = float("-inf")

    # --- out-of-memory errors inside a step ---------------------------------------------------

    def _guard_steps(self) -> None:
        """Wraps the Trainer's `training_step` (once) so that an OOM inside it costs the step."""
        t = self.trainer
        if t is None or getattr(t, "_memwatch_guarded", False):
            return
        original = t.training_step

        def training_step(model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            return self._training_step(original, model, inputs, num_items_in_batch)

        t.training_step = training_step  # type: ignore[method-assign]
        t._memwatch_guarded = True  # type: ignore[attr-defined]

    def _training_step(self, original: Any, model: Any, inputs: Any, num_items_in_batch: Any) -> Any:
        t = self.trainer
        assert t is not None
        args = t.args
        micro, per_step = args.per_device_train_batch_size, args.per_device_train_batch_size * args.gradient_accumulation_steps
        g = self._guard
        if g is None or (self._fresh_window and g.per_step != per_step):
            g = self._guard = oom.Guard(
                micro,
                per_step,
                min_micro_batch=self.min_micro_batch,
                dist=_ranks.distributed(args.world_size),
                on_oom=self._on_oom,
                snapshot_dir=self.oom_snapshot_dir,
            )
        if self._fresh_window:
            g.new_window(list(model.parameters()))
            self._fresh_window = False
        # A loss normalised by the window's item count adds up over pieces as it is; a mean loss
        # is weighted by each piece's share (the Trainer divides it by the accumulation itself).
        scaled = getattr(t, "loss_is_scaled_for_ga", None)
        if scaled is None:
            scaled = (getattr(t, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) or (
                getattr(t, "compute_loss_func", None) is not None
            )
        compute_loss = t.compute_loss

        def run(piece: Any, sync: bool, forward_done: Any) -> Any:
            def guarded(*a: Any, **kw: Any) -> Any:
                out = compute_loss(*a, **kw)
                if isinstance(out, tuple):
                    return (forward_done(out[0]), *out[1:])
                return forward_done(out)

            t.compute_loss = guarded  # type: ignore[method-assign]
            try:
                with oom.grad_sync(model, sync):
                    return original(model, piece, num_items_in_batch)
            finally:
                t.compute_loss = compute_loss  # type: ignore[method-assign]

        try:
            return g.step(inputs, run, last=t.accelerator.sync_gradients, shares=not scaled)
        except oom.AtFloor as e:
            self._at_floor(e, model)
            raise

    def _on_oom(self, e: oom.Oom) -> None:
        self.ooms.append(e)
        if e.recovered and e.own:
            self._tell_oom(e)

    def _tell_oom(self, e: oom.Oom, checkpointed: Optional[bool] = None, relaunch_at: Optional[int] = None) -> None:
        t = self.trainer
        assert t is not None
        args = t.args
        report = e.report()
        report.update(
            epoch=int(t.state.epoch or 0), step=int(t.state.global_step), min_micro_batch=self.min_micro_batch
        )
        if e.recovered:
            report["accumulation_after"] = self._guard.per_step // e.micro_batch_after if self._guard else None
        else:
            report["checkpointed"] = bool(checkpointed)
            if relaunch_at is not None and self._guard is not None:
                report.update(micro_batch_after=relaunch_at, accumulation_after=self._guard.per_step // relaunch_at)
        if args.world_size > 1:
            report.update(rank=args.process_index, world_size=args.world_size)
        self.client.oom(report)

    def _at_floor(self, e: oom.AtFloor, model: Any) -> None:
        """Saves a checkpoint through the Trainer (the weights of the last optimizer step: none
        changed inside the window) and tells memwatch, before `AtFloor` ends the run."""
        t = self.trainer
        assert t is not None
        saved = False
        save = getattr(t, "_save_checkpoint", None)
        if save is not None:
            save(model, None)
            saved = True
        else:
            log.error("memwatch: this Trainer cannot save a checkpoint here; the relaunch resumes from the last one")
        g = self._guard
        relaunch_at = oom.smaller(g.micro, g.per_step, self.min_micro_batch) if e.synced and g is not None else None
        if e.oom.own or e.synced:
            self._tell_oom(e.oom, checkpointed=saved, relaunch_at=relaunch_at)

    def _after_oom(self, kw: Dict[str, Any]) -> None:
        """At an epoch's start: the per-device batch an OOM left, from this epoch on."""
        g = self._guard
        t = self.trainer
        if g is None or t is None or g.micro >= t.args.per_device_train_batch_size:
            return
        self._apply({MICRO_BATCH: g.micro, ACCUMULATION: g.per_step // g.micro}, None, kw["epoch"], kw["train_dataloader"])

    # --- reports -------------------------------------------------------------------------------

    def running(self) -> Dict[str, Any]:
        """What the Trainer runs with now (workers counted live)."""
        if self.trainer is None:
            return {}
        args = self.trainer.args
        return {
            WORKERS: _proc.live_workers(),
            MICRO_BATCH: args.per_device_train_batch_size,
            ACCUMULATION: args.gradient_accumulation_steps,
            PIN_MEMORY: args.dataloader_pin_memory,
        }

    def _report(self, state: Any) -> None:
        if time.monotonic() - self._last_report < self.report_seconds:
            return
        self._last_report = time.monotonic()
        self.client.progress(int(state.epoch or 0), state.global_step, loss=self._loss, running=self.running())

    def _find_trainer(self) -> None:
        """The Trainer this callback belongs to: callbacks are not given it, so it is found among
        the callers (Trainer.__init__ or train())."""
        if self.trainer is not None:
            return
        frame = inspect.currentframe()
        while frame is not None:
            me = frame.f_locals.get("self")
            if isinstance(me, Trainer) and self in getattr(me.callback_handler, "callbacks", []):
                self.trainer = me
                return
            frame = frame.f_back


def _shut_down(loader: Any) -> None:
    """Ends a DataLoader's persistent workers (non-persistent ones ended with their epoch)."""
    for dl in (loader, getattr(loader, "base_dataloader", None)):
        it = getattr(dl, "_iterator", None)
        if dl is not None and it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
            dl._iterator = None


def _forget(trainer: Any, loader: Any) -> None:
    """accelerate keeps every DataLoader it prepared; drop the one replaced."""
    kept = getattr(trainer.accelerator, "_dataloaders", None)
    if isinstance(kept, list) and loader in kept:
        kept.remove(loader)
