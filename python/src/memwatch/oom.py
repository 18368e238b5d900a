"""A CUDA out-of-memory error inside a step costs that step, not the run.

`Guard` runs one accumulation window's micro-batches so that a `torch.OutOfMemoryError` (the class
CUDA raises: "CUDA out of memory. Tried to allocate 2.00 GiB …") is recovered in the step:

- the failed attempt's tensors are dropped (the exception and its traceback first: they keep the
  step's activations alive), and CUDA's cache emptied where CUDA is there;
- the same samples run again as pieces of half the size, each weighted by its share of the
  micro-batch, so the window's gradient is what it would have been;
- an OOM in the backward pass may already have added part of that micro-batch's gradient to some
  parameters: the window's gradients go back to what they were at its start (the weights do not
  change inside a window) and the window's micro-batches so far run again at the smaller size;
- from then on pieces are at most `micro_batch` samples; the integration takes that as its
  micro-batch at the window's end, with the accumulation that keeps micro-batch × accumulation ×
  world size exact, so sample order and effective batch never change;
- below `min_micro_batch` it cannot halve: `AtFloor` is raised (the integration saves a checkpoint and
  stops for a relaunch), never a loop.

With torch.distributed up (DDP), every rank runs the same pieces, each but the window's last with
DDP's gradient sync off for its forward and backward passes (DDP decides at the forward pass): after
each piece's forward pass the ranks agree in one small all-reduce whether any of them ran out of
memory in that forward pass (then every rank retries the piece at half) or in the previous piece's
backward pass (then every rank rolls the window back and runs it again at half). A forward pass with
gradient sync that is dropped leaves DDP expecting its backward pass on that rank, so the agreement
also says whether any rank dropped one, and then the next piece runs with sync on every rank (one
extra all-reduce of the gradients, which averaging leaves exact). An OOM in a backward pass
that synchronises gradients cannot be recovered there: the other ranks wait inside DDP's all-reduce.
That rank raises `AtFloor(synced=True)`; the integration saves a checkpoint of the weights as of the
window's start and the run stops, so that the launcher (torchrun, `mp.spawn`) ends the other ranks
and `memwatch launch` relaunches at half the micro-batch (docs/python.md, "CUDA out of memory").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("memwatch")

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_TRIED = re.compile(r"[Tt]ried to allocate ([0-9.]+) ?(B|KiB|MiB|GiB|TiB)")
_TRIED_BYTES = re.compile(r"you tried to allocate ([0-9]+) bytes")

# What a rank tells the others after each piece's forward pass (the largest wins).
_FINE, _FORWARD, _BACKWARD = 0, 1, 2


def is_oom(e: BaseException) -> bool:
    """Whether `e` is an out-of-memory error from torch: `torch.OutOfMemoryError` (CUDA's, and the
    class torch raises for any device's allocator), or a RuntimeError saying so (older builds, the
    CPU allocator)."""
    try:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):
        pass
    text = str(e)
    return isinstance(e, RuntimeError) and (
        "CUDA out of memory" in text or "DefaultCPUAllocator: can't allocate memory" in text
    )


def requested_bytes(message: str) -> Optional[int]:
    """What the allocator tried to allocate, from an OOM's message ("Tried to allocate 2.00 GiB")."""
    m = _TRIED.search(message)
    if m:
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    m = _TRIED_BYTES.search(message)
    return int(m.group(1)) if m else None


@dataclass
class Oom:
    """One out-of-memory error and what was done about it."""

    phase: str
    """"forward" or "backward"."""
    micro_batch_before: int
    micro_batch_after: int
    """The largest piece from then on (equal to before when it could not halve)."""
    recovered: bool
    message: str = ""
    own: bool = True
    """This rank's own attempt ran out of memory (False: it follows another rank's)."""
    figures: Dict[str, Any] = field(default_factory=dict)
    """What CUDA said at the OOM: requested_bytes, allocated_bytes, reserved_bytes,
    gpu_free_bytes, gpu_total_bytes, device; snapshot (a path) when one was saved."""

    def report(self) -> Dict[str, Any]:
        """The fields of the daemon's `oom` report (docs/protocol.md) this knows."""
        out: Dict[str, Any] = {
            "phase": self.phase,
            "micro_batch_before": self.micro_batch_before,
            "recovered": self.recovered,
            "message": self.message[:500],
        }
        if self.recovered:
            out["micro_batch_after"] = self.micro_batch_after
        out.update({k: v for k, v in self.figures.items() if v is not None})
        return out


class AtFloor(RuntimeError):
    """An out-of-memory error the step cannot recover from: the micro-batch is at its floor, or
    (`synced`) the backward pass that ran out was synchronising gradients with other ranks. Saving a
    checkpoint and relaunching is the way on."""

    def __init__(self, message: str, oom: Oom, synced: bool = False) -> None:
        super().__init__(message)
        self.oom = oom
        self.synced = synced


Runner = Callable[[Any, bool, Callable[[Any], Any]], Any]
"""`run(piece, sync, forward_done)`: a piece's forward pass, `forward_done(loss)`, and the backward
pass of what that returned (`Guard.step`)."""


@dataclass
class _At:
    """The piece a guard is running."""

    sync: bool
    scale: float
    agreed: bool = False


class _Retry(Exception):
    """Internal: this piece again at the new size (every rank agreed)."""


class _Rollback(Exception):
    """Internal: the window from its start again at the new size (every rank agreed)."""


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (in a tensor, sequence or
    mapping)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        for v in batch.values():
            n = _maybe_len(v)
            if n is not None:
                return n
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            n = _maybe_len(v)
            if n is not None:
                return n
    raise TypeError(f"cannot tell how many samples a batch of type {type(batch).__name__} holds: no tensor in it")


def _maybe_len(v: Any) -> Optional[int]:
    try:
        return batch_len(v)
    except TypeError:
        return None


def piece(batch: Any, start: int, length: int) -> Any:
    """Samples `start` … `start + length` of a batch: every tensor sliced along its first dimension
    (a view, no copy), sequences and mappings piece by piece, anything else kept as it is."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.narrow(0, start, length) if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return type(batch)({k: piece(v, start, length) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(piece(v, start, length) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(piece(v, start, length) for v in batch)
    return batch


def smaller(micro: int, per_step: int, floor: int) -> Optional[int]:
    """The micro-batch after an OOM at `micro`: the largest at most half of it that divides
    `per_step` (a rank's samples per optimizer step), so that the accumulation stays whole; None
    below `floor`."""
    for m in range(micro // 2, 0, -1):
        if per_step % m == 0:
            return m if m >= floor else None
    return None


def cuda_figures(message: str, snapshot_dir: Optional[str]) -> Dict[str, Any]:
    """What CUDA says now (after the failed attempt's tensors are gone), for the report; a memory
    snapshot saved into `snapshot_dir` where CUDA records its memory history."""
    out: Dict[str, Any] = {"requested_bytes": requested_bytes(message)}
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return out
        device = torch.cuda.current_device()
        out["device"] = device
        out["allocated_bytes"] = int(torch.cuda.memory_allocated(device))
        out["reserved_bytes"] = int(torch.cuda.memory_reserved(device))
        free, total = torch.cuda.mem_get_info(device)
        out["gpu_free_bytes"], out["gpu_total_bytes"] = int(free), int(total)
        if snapshot_dir:
            os.makedirs(snapshot_dir, exist_ok=True)
            path = os.path.join(snapshot_dir, f"oom-{os.getpid()}-{int(time.time() * 1000)}.pickle")
            torch.cuda.memory._dump_snapshot(path)
            out["snapshot"] = path
    except Exception as e:  # figures are a help; never let them end the run
        log.debug("memwatch: no CUDA figures for the OOM report: %s", e)
    return out


def _free() -> None:
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except ImportError:
        pass


class Guard:
    """Runs one loop's accumulation windows so that an OOM costs the step, not the run.

    micro_batch: the largest piece it runs now (the loop's micro-batch). per_step: a rank's samples
    per optimizer step (micro-batch × accumulation), which every micro-batch it moves to divides.
    min_micro_batch: the floor. dist: torch.distributed when this is one rank of several (None
    alone). on_oom: told of every OOM, recovered or not, before it goes on. snapshot_dir: where a
    CUDA memory snapshot is saved (CUDA with memory history recording on).
    """

    def __init__(
        self,
        micro_batch: int,
        per_step: int,
        *,
        min_micro_batch: int = 1,
        dist: Any = None,
        on_oom: Optional[Callable[[Oom], None]] = None,
        snapshot_dir: Optional[str] = None,
    ) -> None:
        if min_micro_batch < 1:
            raise ValueError(f"min_micro_batch must be at least 1, not {min_micro_batch}")
        self.micro = int(micro_batch)
        self.per_step = int(per_step)
        self.floor = int(min_micro_batch)
        self.dist = dist
        self.on_oom = on_oom
        self.snapshot_dir = snapshot_dir or os.environ.get("MEMWATCH_OOM_SNAPSHOT_DIR")
        self.ooms: List[Oom] = []
        self.agreements = 0
        """All-reduces made to agree with the other ranks (one a piece under DDP)."""
        self._window: List[Tuple[Any, float, bool, bool]] = []
        self._at = _At(False, 1.0)
        self._params: List[Any] = []
        self._grad_was_none: List[bool] = []
        self._pending = _FINE  # this rank's previous unsynced backward ran out of memory
        self._pending_oom: Optional[Oom] = None
        self._force_sync = False  # a rank dropped a forward pass with gradient sync

    def new_window(self, params: Sequence[Any]) -> None:
        """A window begins: its gradients are what the optimizer left (zero, or None)."""
        self._window = []
        self._params = [p for p in params if getattr(p, "requires_grad", False)]
        self._grad_was_none = [p.grad is None for p in self._params]

    def step(self, batch: Any, run: Runner, *, weight: float = 1.0, last: bool, shares: bool = True) -> Any:
        """Runs one micro-batch of the window, piece by piece. For each piece `run(piece, sync,
        forward_done)` computes the piece's loss with DDP's gradient sync on or off as `sync` says
        (`grad_sync`; on for the window's last piece), hands that loss to `forward_done`, and runs
        the backward pass of what `forward_done` returns: the loss × `weight`, × the piece's share of
        the micro-batch when `shares` (a mean loss; False for a loss already normalised over the
        whole window, as Hugging Face's by `num_items_in_batch`). `last`: this is the window's last
        micro-batch. Returns the sum of what `run` returned for its pieces."""
        self._window.append((batch, weight, last, shares))
        start = len(self._window) - 1
        while True:
            try:
                total: Any = None
                for i in range(start, len(self._window)):
                    total = self._run(self._window[i], run)
                return total
            except _Rollback:
                self._rollback()
                start = 0

    # --- one micro-batch -------------------------------------------------------------------

    def _run(self, item: Tuple[Any, float, bool, bool], run: Runner) -> Any:
        batch, weight, last, shares = item
        n = batch_len(batch)
        done, total = 0, None
        while done < n:
            size = min(self.micro, n - done)
            scale = weight * size / n if shares else weight
            try:
                value = self._piece(piece(batch, done, size), scale, last and done + size == n, run)
            except _Retry:
                continue
            total = value if total is None else total + value
            done += size
        return total

    def _piece(self, p: Any, scale: float, sync: bool, run: Runner) -> Any:
        sync = sync or self._force_sync
        self._at = _At(sync, scale)
        if self._pending != _FINE:
            # This rank's last backward pass ran out of memory: tell the others, run nothing.
            self._settle(self._pending, False, "")
        failed = None
        try:
            value = run(p, sync, self._forward_done)
        except (_Retry, _Rollback):
            raise
        except Exception as e:
            if not is_oom(e):
                raise
            failed = str(e)
        # Leaving the handler dropped the exception and its frames (which hold the activations).
        if failed is None:
            if sync:
                self._force_sync = False
            return value
        _free()
        if not self._at.agreed:
            self._settle(_FORWARD, False, failed)
        if self.dist is not None and sync:
            # The other ranks wait inside DDP's all-reduce of this very backward pass.
            oom = self._oom("backward", failed, self.micro, recovered=False)
            raise AtFloor(
                "out of memory in a backward pass that synchronises gradients with the other ranks: "
                "it cannot be recovered in the step; save a checkpoint and relaunch at a smaller micro-batch",
                oom,
                synced=True,
            )
        if self.dist is None:
            self._halve("backward", failed, own=True)
            raise _Rollback()
        # Told to the other ranks at the next piece's agreement.
        self._pending = _BACKWARD
        self._pending_oom = Oom("backward", self.micro, self.micro, False, failed)
        raise _Retry()

    def _forward_done(self, loss: Any) -> Any:
        """Called by the runner with a piece's loss once its forward pass is through: agrees with
        the other ranks (raising to retry or roll back when any ran out of memory), and returns
        the loss to run the backward pass of."""
        self._settle(_FINE, self._at.sync, "")
        self._at.agreed = True
        return loss * self._at.scale

    def _settle(self, mine: int, synced: bool, message: str) -> None:
        """Agrees this piece's verdict with the other ranks; returns only when every rank's is fine."""
        verdict, dropped_sync = self._agree(mine, synced)
        if verdict == _FINE:
            return
        self._force_sync = dropped_sync
        if verdict == _BACKWARD:
            oom, self._pending, self._pending_oom = self._pending_oom, _FINE, None
            self._halve("backward", oom.message if oom else "", own=oom is not None)
            raise _Rollback()
        self._halve("forward", message, own=mine == _FORWARD)
        raise _Retry()

    def _agree(self, mine: int, synced: bool) -> Tuple[int, bool]:
        """The largest of every rank's verdict, and whether any rank ran this piece's forward pass
        with gradient sync (one all-reduce under DDP; every rank calls it once a piece)."""
        if self.dist is None:
            return mine, False
        import torch

        from ._ranks import _device

        t = torch.tensor([mine, int(synced)], dtype=torch.int32, device=_device(self.dist))
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        self.agreements += 1
        verdict, any_synced = (int(v) for v in t.tolist())
        return verdict, bool(any_synced)

    def _halve(self, phase: str, message: str, own: bool) -> None:
        before = self.micro
        after = smaller(before, self.per_step, self.floor)
        if after is None:
            oom = self._oom(phase, message, before, recovered=False, own=own)
            raise AtFloor(
                f"out of memory in the {phase} pass at micro-batch {before}, and no smaller micro-batch "
                f"of at least {self.floor} (min_micro_batch) divides the {self.per_step} samples a rank "
                "takes per optimizer step",
                oom,
            )
        self.micro = after
        self._oom(phase, message, before, recovered=True, own=own)

    def _oom(self, phase: str, message: str, before: int, *, recovered: bool, own: bool = True) -> Oom:
        figures = cuda_figures(message, self.snapshot_dir) if own else {}
        oom = Oom(phase, before, self.micro, recovered, message.split("\n")[0], own, figures)
        self.ooms.append(oom)
        if own:
            log.warning(
                "memwatch: out of memory in the %s pass at micro-batch %d: %s",
                phase,
                before,
                f"running the same samples at {self.micro}" if recovered else "the step cannot be recovered",
            )
        if self.on_oom is not None:
            self.on_oom(oom)
        return oom

    def _rollback(self) -> None:
        """The window's gradients back to what they were at its start: zero where they were
        tensors (zeroed by the optimizer), None where they were None."""
        for p, was_none in zip(self._params, self._grad_was_none):
            if was_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()
        _free()


@contextlib.contextmanager
def grad_sync(model: Any, sync: bool) -> Iterator[None]:
    """DDP's gradient sync on or off for one piece's forward pass (where DDP decides whether the
    backward pass synchronises), whatever an outer `no_sync()` (accelerate's `accumulate`) set;
    nothing for a model that is not DDP's."""
    if not hasattr(model, "require_backward_grad_sync"):
        yield
        return
    before = model.require_backward_grad_sync
    model.require_backward_grad_sync = sync
    try:
        yield
    finally:
        model.require_backward_grad_sync = before
