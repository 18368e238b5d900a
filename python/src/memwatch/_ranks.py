"""Every rank of a distributed job changes the same way at the same boundary.

Each rank's memwatch is the one on its own node, and decides for that node alone: one rank may be
asked for half the micro-batch while the others are asked nothing. Ranks that disagree on the
micro-batch or the accumulation break the job (a different number of backward passes per optimizer
step: DDP's all-reduce waits forever) or its effective batch. So at each boundary where a change may
be taken, the ranks exchange what their memwatch asks (over torch.distributed's default group, the
one DDP uses) and all take the same micro-batch: the smallest any of them was asked for, with the
accumulation that keeps micro-batch × accumulation × world size the effective batch. DataLoader
workers and pin_memory are a node's own memory and stay each rank's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .client import ACCUMULATION, MICRO_BATCH, Client, Directives

log = logging.getLogger("memwatch")


@dataclass(frozen=True)
class Proposal:
    """What one rank's memwatch asks at a boundary."""

    rank: int
    micro_batch: int


def distributed(world_size: int) -> Any:
    """torch.distributed when this process is one rank of a job of `world_size` > 1 processes whose
    default group is up; else None (a single process, or a loader told of no world)."""
    if world_size < 2:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(dist: Any, flag: bool) -> bool:
    """Whether `flag` holds on any rank (one small all-reduce; every rank must call it)."""
    import torch

    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather(dist: Any, mine: Optional[Proposal]) -> List[Proposal]:
    """Every rank's proposal (every rank must call it): one small all-gather of tensors, each rank's
    micro-batch asked for or -1 for none. Not `all_gather_object`, which needs numpy, and torch does
    not."""
    import torch

    device = _device(dist)
    t = torch.tensor([mine.micro_batch if mine is not None else -1], dtype=torch.int64, device=device)
    out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [Proposal(rank, int(v.item())) for rank, v in enumerate(out) if int(v.item()) >= 0]


def agreed_micro_batch(proposals: List[Proposal], current: int) -> int:
    """The micro-batch every rank takes: the smallest asked for (`current` when none asked)."""
    return min((p.micro_batch for p in proposals), default=current)


@dataclass
class Settled:
    """What this rank takes at a boundary, settled with the other ranks."""

    new: Dict[str, Any] = field(default_factory=dict)
    """The knobs' new values for this rank: the agreed micro-batch and accumulation, its own
    memwatch's workers and pin_memory."""
    generation: Optional[int] = None
    """Its own memwatch's directives (to acknowledge, or to answer `cannot_apply`); None when its
    memwatch asked nothing."""
    asked_by: List[int] = field(default_factory=list)
    """The ranks whose memwatch asked for a change."""
    why: Optional[str] = None
    """Why no rank takes the change (the micro-batch agreed on does not divide the batch)."""


def settle(dist: Any, mine: Optional[Directives], micro_now: int, per_step: int) -> Optional[Settled]:
    """Settles this boundary's change with the other ranks (every rank calls it at the same
    boundary): `mine` is what this rank's memwatch asks (None: nothing), `micro_now` the micro-batch
    every rank runs, `per_step` micro-batch × accumulation (each rank's share of the effective batch).
    None when no rank was asked for anything."""
    new = dict(mine.new_values()) if mine is not None else {}
    proposal = None
    if mine is not None:
        proposal = Proposal(dist.get_rank(), int(new.get(MICRO_BATCH, micro_now)))
    proposals = gather(dist, proposal)
    if not proposals:
        return None
    micro = agreed_micro_batch(proposals, micro_now)
    out = Settled(generation=mine.generation if mine is not None else None, asked_by=[p.rank for p in proposals])
    if micro < 1 or per_step % micro:
        out.why = f"micro-batch {micro} does not divide {per_step} samples a rank per optimizer step"
        return out
    new[MICRO_BATCH], new[ACCUMULATION] = micro, per_step // micro
    out.new = new
    return out


def settled(
    client: Optional[Client], dist: Any, mine: Optional[Directives], micro_now: int, per_step: int
) -> Optional[Settled]:
    """[`settle`], with a change no rank can take said: logged, and this rank's own directives
    answered with why (`cannot_apply`). None when this rank takes nothing."""
    s = settle(dist, mine, micro_now, per_step)
    if s is not None and s.why is not None:
        log.error("memwatch: %s; no rank applies the change", s.why)
        if s.generation is not None and client is not None:
            client.cannot_apply(s.generation, s.why)
        return None
    return s
