"""A model that runs out of memory as a GPU would: its forward pass, or its backward pass half-way
through (after the last layer's gradients are accumulated, before the first layer's), raises the
real `torch.OutOfMemoryError` (the class CUDA raises, with CUDA's message) when a micro-batch holds
more samples than its budget. The budgets can change mid-run, as when a second job takes the GPU.

Samples carry their index, so a test can tell which samples were trained on, in which order."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch.utils.data import Dataset

MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which "
    "1.20 GiB is free. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 6.50 GiB is "
    "reserved by PyTorch but unallocated."
)


class Indexed(Dataset):
    """n samples of `features` float64 inputs and a target, each with its index."""

    def __init__(self, n: int = 64, features: int = 6, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g, dtype=torch.float64)
        self.y = torch.randn(n, 1, generator=g, dtype=torch.float64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


class _Spend(torch.autograd.Function):
    """Identity forward; its backward spends the budget of the module it belongs to."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: "Budgeted") -> torch.Tensor:  # type: ignore[override]
        ctx.owner = owner
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:  # type: ignore[override]
        owner = ctx.owner
        if owner.backward_budget is not None and grad.shape[0] > owner.backward_budget:
            owner.ooms.append(("backward", int(grad.shape[0])))
            raise torch.OutOfMemoryError(MESSAGE)
        return grad, None


class Budgeted(torch.nn.Module):
    """Linear → tanh → (the backward budget) → Linear, in float64."""

    def __init__(self, features: int = 6, hidden: int = 8, seed: int = 1) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.first = torch.nn.Linear(features, hidden, dtype=torch.float64)
        self.last = torch.nn.Linear(hidden, 1, dtype=torch.float64)
        self.forward_budget: Optional[int] = None
        self.backward_budget: Optional[int] = None
        self.ooms: List[Tuple[str, int]] = []
        self.seen: List[int] = []
        """The sample indices of every forward pass that completed, in order."""

    def forward(self, x: torch.Tensor, idx: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.forward_budget is not None and x.shape[0] > self.forward_budget:
            # As CUDA's caching allocator does: some activations exist already when it fails.
            _held = torch.empty(x.shape[0], 1024, dtype=torch.float64)
            self.ooms.append(("forward", int(x.shape[0])))
            raise torch.OutOfMemoryError(MESSAGE)
        h = torch.tanh(self.first(x))
        h = _Spend.apply(h, self)
        if idx is not None:
            self.seen.extend(int(i) for i in idx)
        return self.last(h)


def mse(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y, idx = batch
    return torch.nn.functional.mse_loss(model(x, idx), y)


def weights(model: torch.nn.Module) -> List[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]
