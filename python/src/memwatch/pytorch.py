"""Plain PyTorch: a DataLoader that memwatch can change mid-run.

`AdaptiveLoader` owns the DataLoader and rebuilds it when memwatch changes the DataLoader workers,
pin_memory or the micro-batch: at the next epoch for a plain change, at the next accumulation
boundary for an urgent one (the job runs on emergency room), over the samples the epoch has not seen
yet. It hands out exact accumulation windows, so micro-batch × accumulation × world size never
changes::

    client = memwatch.Client(config_file="train.json", keys=[...])
    loader = memwatch.pytorch.AdaptiveLoader(dataset, client, batch_size=32, accumulation=2)
    for epoch in range(epochs):
        for x, y in loader:
            loader.backward(model, (x, y), lambda b: loss_fn(model(b[0]), b[1]))
            if loader.sync:                 # the last micro-batch of its window
                opt.step(); opt.zero_grad()

`loader.backward` is the guard around the step: it scales the loss to its window and runs the
backward pass, and a CUDA out-of-memory error inside it costs that step, not the run (`memwatch.oom`:
the same samples again at half the micro-batch, exactly; below `min_micro_batch`, a checkpoint and a
clean stop for `memwatch launch` to relaunch). A loop may instead call `loss.backward()` itself with
`loss / loader.window`, as before, without the guard.

With torch.distributed's default group up and `world_size` > 1, every rank takes the same
micro-batch and accumulation at the same boundary, whichever rank's memwatch asked (`_ranks`): at
each epoch's start, and at each accumulation window for an urgent change (one small all-reduce a
window).

torch is imported when a loader is made, not with the package.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from . import _proc, _ranks, oom
from .client import ACCUMULATION, MICRO_BATCH, PIN_MEMORY, WORKERS, Client, Directives

log = logging.getLogger("memwatch")


def accumulation_for(effective_batch: int, micro_batch: int, world_size: int = 1) -> int:
    """The accumulation that keeps `micro_batch × accumulation × world_size == effective_batch`
    exactly; ValueError where no whole number does."""
    per_step = micro_batch * world_size
    if micro_batch < 1 or world_size < 1 or effective_batch % per_step:
        raise ValueError(
            f"an effective batch of {effective_batch} is not a whole number of micro-batches of "
            f"{micro_batch} × {world_size} processes"
        )
    return effective_batch // per_step


class AdaptiveLoader:
    """An epoch-at-a-time iterable over `dataset` whose DataLoader memwatch may change.

    client: the run's `memwatch.Client` (None: a plain loader that never changes). The first
    iteration attaches it (or checks the job `memwatch launch` attached): a refusal raises
    `MemwatchError` before the first batch.
    batch_size, accumulation, num_workers, pin_memory: the starting values (the config file's).
    shuffle, seed: a fresh permutation each epoch from `seed + epoch` (so a resumed run sees the
    same order). rank, world_size: this process's share of each epoch (padded to equal shares).
    checkpoint: called with `state_dict()` at an accumulation boundary when memwatch asks for a
    checkpoint (before it stops the job cleanly); memwatch is told once it returns.
    prepare: wraps each new DataLoader (e.g. `accelerator.prepare`).
    min_micro_batch: the smallest micro-batch `backward` halves down to after an out-of-memory
    error; below it the run saves a checkpoint and stops (`memwatch.oom.AtFloor`).
    oom_snapshot_dir: where a CUDA memory snapshot is saved at an OOM (CUDA with memory history
    recording on) [default: `MEMWATCH_OOM_SNAPSHOT_DIR`, else none].
    report_seconds: how often it reports what it runs with.
    Other keyword arguments go to every DataLoader (collate_fn, …).
    """

    def __init__(
        self,
        dataset: Any,
        client: Optional[Client] = None,
        *,
        batch_size: int,
        accumulation: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        checkpoint: Optional[Callable[[Dict[str, Any]], None]] = None,
        prepare: Optional[Callable[[Any], Any]] = None,
        min_micro_batch: int = 1,
        oom_snapshot_dir: Optional[str] = None,
        report_seconds: float = 2.0,
        **loader_kwargs: Any,
    ) -> None:
        self.dataset = dataset
        self.client = client
        self.micro_batch = int(batch_size)
        self.accumulation = int(accumulation)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        self.world_size = int(world_size)
        self.effective_batch = self.micro_batch * self.accumulation * self.world_size
        self.shuffle, self.seed, self.drop_last, self.rank = shuffle, seed, drop_last, rank
        self.checkpoint = checkpoint
        self.prepare = prepare
        self.report_seconds = report_seconds
        self.loader_kwargs = loader_kwargs
        self.epoch = 0
        self.position = 0
        """Samples of this epoch's share already trained on (whole accumulation windows)."""
        self.step = 0
        """Micro-batches handed out in this epoch."""
        self.window = self.accumulation
        """Micro-batches in the current accumulation window (fewer only at an epoch's end)."""
        self.sync = False
        """True for the last micro-batch of its window: step the optimizer after it."""
        self.rebuilds = 0
        self.min_micro_batch = int(min_micro_batch)
        self.oom_snapshot_dir = oom_snapshot_dir
        self.ooms: List[oom.Oom] = []
        """Every out-of-memory error `backward` met, recovered or not."""
        self._guard: Optional[oom.Guard] = None
        self._window_open = False
        self._fresh_window = False
        self._last_report = float("-inf")
        self._checkpointed = False
        self._started = False
        # A checkpoint request must be answered also while the loop waits for a batch from workers
        # memwatch has paused (only the root runs then): a watcher thread saves it meanwhile. The
        # lock keeps the loop from going on while it does, and the client to one thread at a time.
        self._lock = threading.Lock()
        self._waiting_since: Optional[float] = None
        self._watcher: Optional[threading.Thread] = None

    # --- what it runs with ---------------------------------------------------------------------

    def running(self) -> Dict[str, Any]:
        """What the loader runs with now, as memwatch's knobs (workers counted live)."""
        return {
            WORKERS: _proc.live_workers(),
            MICRO_BATCH: self.micro_batch,
            ACCUMULATION: self.accumulation,
            PIN_MEMORY: self.pin_memory,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            MICRO_BATCH: self.micro_batch,
            ACCUMULATION: self.accumulation,
            WORKERS: self.num_workers,
            PIN_MEMORY: self.pin_memory,
            "generation": self.client.generation if self.client else 0,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes where `state_dict()` was taken: the same epoch, past the samples it had seen. The
        knobs come from the config (which memwatch may have rewritten since), not from the state."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
        # A run stopped by an out-of-memory error it could not recover from in the step restarts at
        # the micro-batch it asked for, unless the config (memwatch's staging) is smaller already.
        asked = int(state.get("oom_micro_batch", 0) or 0)
        if 0 < asked < self.micro_batch and self._check(asked, self.effective_batch // (asked * self.world_size)) is None:
            self.micro_batch, self.accumulation = asked, self.effective_batch // (asked * self.world_size)

    # --- iteration -----------------------------------------------------------------------------

    def __len__(self) -> int:
        """Micro-batches in a whole epoch at the current micro-batch."""
        n = len(self._order())
        return n // self.micro_batch if self.drop_last else math.ceil(n / self.micro_batch)

    def __iter__(self) -> Iterator[Any]:
        if self.client is not None and not self._started:
            # Before the first step: a job memwatch refuses (no job by this name, a wrong token, a
            # bad config file) raises MemwatchError here; an outage only warns.
            self.client.attach()
            self._started = True
        if self.client is not None and self.checkpoint is not None and self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="memwatch-checkpoint", daemon=True)
            self._watcher.start()
        self._at_epoch_start()
        order = self._order()
        n = len(order)
        self.step = 0
        while self._batches_left(n) > 0:
            loader = iter(self._build(order[self.position :]))
            while self._batches_left(n) > 0:
                # A window boundary: the optimizer has stepped on everything handed out so far.
                if self._urgent_change():
                    break
                with self._lock:
                    self._maybe_checkpoint()
                self.window = min(self.accumulation, self._batches_left(n))
                samples = self.window * self.micro_batch
                self._window_start()
                self._window_open = self._fresh_window = True
                for i in range(self.window):
                    batch = self._next(loader)
                    self.sync = i == self.window - 1
                    self.step += 1
                    yield batch
                self._window_open = False
                self.position = min(n, self.position + samples)
                self._report()
                if self._after_oom():
                    break
            del loader  # its workers exit now, with their memory
        self.epoch += 1
        self.position = 0
        self.sync = False

    def _batches_left(self, n: int) -> int:
        left = n - self.position
        return left // self.micro_batch if self.drop_last else math.ceil(left / self.micro_batch)

    def _order(self) -> List[int]:
        n = len(self.dataset)
        order = list(range(n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        if self.world_size > 1:
            total = math.ceil(n / self.world_size) * self.world_size
            order = (order + order[: total - n])[self.rank :: self.world_size]
        return order

    def _build(self, indices: List[int]) -> Any:
        from torch.utils.data import DataLoader, Subset

        self.rebuilds += 1
        dl = DataLoader(
            Subset(self.dataset, indices),
            batch_size=self.micro_batch,
            shuffle=False,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            drop_last=self.drop_last,
            **self.loader_kwargs,
        )
        return self.prepare(dl) if self.prepare else dl

    def _next(self, loader: Iterator[Any]) -> Any:
        with self._lock:
            self._waiting_since = time.monotonic()
        try:
            return next(loader)
        finally:
            with self._lock:
                self._waiting_since = None

    def _watch(self) -> None:
        """Answers a checkpoint request while the loop has waited over a second for a batch."""
        while not self._checkpointed:
            time.sleep(0.25)
            with self._lock:
                since = self._waiting_since
                if since is not None and time.monotonic() - since >= 1.0:
                    self._maybe_checkpoint()

    def _window_start(self) -> None:
        """Called as each accumulation window begins (`window` is set)."""

    def _check(self, micro: int, accumulation: int) -> Optional[str]:
        """Why a change to `micro` × `accumulation` cannot be applied, if it cannot."""
        if micro * accumulation * self.world_size != self.effective_batch:
            return (
                f"micro-batch {micro} × accumulation {accumulation} × world size {self.world_size} "
                f"is not the effective batch {self.effective_batch}"
            )
        return None

    # --- the step, guarded against out-of-memory errors ----------------------------------------

    def backward(self, model: Any, batch: Any, loss_of: Callable[[Any], Any]) -> Any:
        """Runs the backward pass of the micro-batch just handed out: `loss_of(batch)` gives its
        mean loss (any piece of it, for that matter), scaled here to the window. An out-of-memory
        error costs this step, not the run (`memwatch.oom`). Under DDP, `model` is the DDP module:
        every piece but the window's last runs with its gradient sync off, so do not wrap the call
        in `no_sync()` yourself. Returns the loss it ran the backward pass of (the micro-batch's share
        of the window's mean loss, detached: a window's add up to its mean loss). At the floor, saves a checkpoint (the
        loader's `checkpoint` function, with the position at the window's start, since no weight
        changed inside the window), tells memwatch, and raises `memwatch.oom.AtFloor`."""
        if not self._window_open:
            raise RuntimeError("AdaptiveLoader.backward is called for a micro-batch the loader handed out, inside its loop")
        g = self._guard
        per_step = self.micro_batch * self.accumulation
        if g is None or (self._fresh_window and (g.micro != self.micro_batch or g.per_step != per_step)):
            g = self._guard = oom.Guard(
                self.micro_batch,
                per_step,
                min_micro_batch=self._floor(),
                dist=_ranks.distributed(self.world_size),
                on_oom=self._on_oom,
                snapshot_dir=self.oom_snapshot_dir,
            )
        if self._fresh_window:
            g.new_window(list(model.parameters()))
            self._fresh_window = False
        def run(piece: Any, sync: bool, forward_done: Callable[[Any], Any]) -> Any:
            with oom.grad_sync(model, sync):
                loss = forward_done(loss_of(piece))
            self._backward_pass(loss)
            return loss.detach()

        try:
            return g.step(batch, run, weight=self._scale(), last=self.sync)
        except oom.AtFloor as e:
            self._at_floor(e)
            raise

    def _scale(self) -> float:
        """What a micro-batch's mean loss is multiplied by: its share of the window."""
        return 1.0 / self.window

    def _floor(self) -> int:
        """The smallest micro-batch an out-of-memory error may halve down to."""
        return self.min_micro_batch

    def _backward_pass(self, loss: Any) -> None:
        loss.backward()

    def _on_oom(self, e: oom.Oom) -> None:
        self.ooms.append(e)
        if e.recovered and e.own:
            self._tell_oom(e, recovered=True)

    def _tell_oom(
        self, e: oom.Oom, *, recovered: bool, checkpointed: bool = False, relaunch_at: Optional[int] = None
    ) -> None:
        if self.client is None:
            return
        report = e.report()
        report.update(epoch=self.epoch, step=self.step, min_micro_batch=self.min_micro_batch)
        per_step = self.micro_batch * self.accumulation
        if recovered:
            report["accumulation_after"] = per_step // e.micro_batch_after
        else:
            report["checkpointed"] = checkpointed
            if relaunch_at is not None:
                report.update(micro_batch_after=relaunch_at, accumulation_after=per_step // relaunch_at)
        if self.world_size > 1:
            report.update(rank=self.rank, world_size=self.world_size)
        self.client.oom(report)

    def _after_oom(self) -> bool:
        """At a window's end: the micro-batch an out-of-memory error left, taken from the next
        window on (True: rebuild the DataLoader at it)."""
        g = self._guard
        if g is None or g.micro >= self.micro_batch:
            return False
        before = self.micro_batch
        self.micro_batch, self.accumulation = g.micro, g.per_step // g.micro
        log.warning(
            "memwatch: rank %d at epoch %d: micro-batch %d, accumulation %d from now on (was %d) after an "
            "out-of-memory error",
            self.rank,
            self.epoch,
            self.micro_batch,
            self.accumulation,
            before,
        )
        self._last_report = float("-inf")
        return True

    def _at_floor(self, e: oom.AtFloor) -> None:
        """Saves a checkpoint at the window's start and tells memwatch, before `AtFloor` ends the run."""
        per_step = self.micro_batch * self.accumulation
        relaunch_at = oom.smaller(self.micro_batch, per_step, self.min_micro_batch) if e.synced else None
        saved = False
        if self.checkpoint is not None:
            state = self.state_dict()
            state["oom_micro_batch"] = relaunch_at or min(self.micro_batch, self._guard.micro if self._guard else self.micro_batch)
            self.checkpoint(state)
            saved = True
        else:
            log.error("memwatch: out of memory at the floor and this loader was given no `checkpoint` function")
        if e.oom.own or e.synced:
            self._tell_oom(e.oom, recovered=False, checkpointed=saved, relaunch_at=relaunch_at)

    # --- memwatch ------------------------------------------------------------------------------

    def _at_epoch_start(self) -> None:
        d = self.client.directives(force=True) if self.client is not None else None
        mine = d if d is not None and d.pending else None
        dist = _ranks.distributed(self.world_size)
        if dist is not None:
            self._agree(dist, mine)
        elif mine is not None:
            self._apply(mine)

    def _urgent_change(self) -> bool:
        d = self.client.directives() if self.client is not None else None
        mine = d if d is not None and d.pending and d.urgent else None
        dist = _ranks.distributed(self.world_size)
        if dist is not None:
            # One small all-reduce an accumulation window, so that every rank breaks at the same one.
            return _ranks.any_rank(dist, mine is not None) and self._agree(dist, mine)
        return mine is not None and self._apply(mine)

    def _agree(self, dist: Any, mine: Optional[Directives]) -> bool:
        """With the other ranks (`_ranks.settle`): every rank takes the smallest micro-batch any
        rank's memwatch asks for, and the accumulation that keeps the effective batch; workers and
        pin_memory from its own memwatch. Acknowledges its own directives (or says why not). True
        when the DataLoader must be rebuilt. Every rank calls it at the same boundary."""
        s = _ranks.settled(self.client, dist, mine, self.micro_batch, self.micro_batch * self.accumulation)
        if s is None:
            return False
        micro = int(s.new.get(MICRO_BATCH, self.micro_batch))
        why = self._check(micro, int(s.new.get(ACCUMULATION, self.accumulation)))
        if why is not None:
            log.error("memwatch: %s; no rank applies the change", why)
            if s.generation is not None and self.client is not None:
                self.client.cannot_apply(s.generation, why)
            return False
        before = (self.micro_batch, self.num_workers, self.pin_memory)
        self.micro_batch, self.accumulation = micro, int(s.new[ACCUMULATION])
        self.num_workers = int(s.new.get(WORKERS, self.num_workers))
        self.pin_memory = bool(s.new.get(PIN_MEMORY, self.pin_memory))
        log.info(
            "memwatch: rank %d at epoch %d, with every rank (asked by rank(s) %s): micro-batch %d, "
            "accumulation %d, workers %d, pin_memory %s",
            dist.get_rank(),
            self.epoch,
            ", ".join(map(str, s.asked_by)),
            self.micro_batch,
            self.accumulation,
            self.num_workers,
            self.pin_memory,
        )
        if s.generation is not None and self.client is not None:
            self.client.ack(s.generation, self.epoch)
        self._last_report = float("-inf")
        return before != (self.micro_batch, self.num_workers, self.pin_memory)

    def _apply(self, d: Directives) -> bool:
        """Takes the directives' values; acknowledges them (or says why not). True when the
        DataLoader must be rebuilt."""
        assert self.client is not None
        new = d.new_values()
        micro = int(new.get(MICRO_BATCH, self.micro_batch))
        accumulation = int(new.get(ACCUMULATION, self.accumulation))
        why = self._check(micro, accumulation)
        if why is not None:
            log.error("memwatch: %s; the change is not applied", why)
            self.client.cannot_apply(d.generation, why)
            return False
        before = (self.micro_batch, self.num_workers, self.pin_memory)
        self.micro_batch, self.accumulation = micro, accumulation
        self.num_workers = int(new.get(WORKERS, self.num_workers))
        self.pin_memory = bool(new.get(PIN_MEMORY, self.pin_memory))
        log.info(
            "memwatch: generation %d%s at epoch %d: micro-batch %d, accumulation %d, workers %d, pin_memory %s",
            d.generation,
            " (urgent)" if d.urgent else "",
            self.epoch,
            self.micro_batch,
            self.accumulation,
            self.num_workers,
            self.pin_memory,
        )
        self.client.ack(d.generation, self.epoch)
        self._last_report = float("-inf")
        return before != (self.micro_batch, self.num_workers, self.pin_memory)

    def _maybe_checkpoint(self) -> None:
        if self.client is None or self._checkpointed:
            return
        d = self.client.directives()
        if d is None or not d.checkpoint_requested:
            return
        if self.checkpoint is None:
            log.warning("memwatch asks for a checkpoint, and this loader was given no `checkpoint` function")
            self._checkpointed = True
            return
        self.checkpoint(self.state_dict())
        self._checkpointed = self.client.checkpoint_saved()

    def _report(self) -> None:
        if self.client is None or time.monotonic() - self._last_report < self.report_seconds:
            return
        self._last_report = time.monotonic()
        self.client.progress(self.epoch, self.step, running=self.running())
