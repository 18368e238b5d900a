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

from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass(frozen=True)
class Proposal:
    """What one rank's memwatch asks at a boundary."""

    rank: int
    micro_batch: int
    urgent: bool


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
    """Every rank's proposal (every rank must call it)."""
    out: List[Optional[Proposal]] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return [p for p in out if p is not None]


def agreed_micro_batch(proposals: List[Proposal], current: int) -> int:
    """The micro-batch every rank takes: the smallest asked for (`current` when none asked)."""
    return min((p.micro_batch for p in proposals), default=current)
