"""What the out-of-memory guard costs a step when nothing fails (scripts/bench-oom-guard.sh).

1. One process: a small MLP (4 × 1024 hidden, float32, CPU) trained on micro-batches of 64 with
   accumulation 4, once with a plain loop (`loss / window`, `loss.backward()`) and once through
   `AdaptiveLoader.backward`, in alternating order, ROUNDS rounds of STEPS optimizer steps each.
   Reported: the median time per optimizer step of each, and the median of the per-round ratios.
2. DDP: two gloo ranks on this machine's cores, the same model and loop, plain (`no_sync()` on all
   but the window's last micro-batch, as DDP's documentation does) against the guard (whose one
   all-reduce of two int32 a micro-batch is the agreement), alternating, as above.

Neither covers CUDA: on a GPU each agreement also waits for the device (`.tolist()`), where a plain
loop may run ahead of it; run it on a lent GPU for that figure.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memwatch.pytorch import AdaptiveLoader

ROUNDS = int(os.environ.get("ROUNDS", "15"))
STEPS = int(os.environ.get("STEPS", "20"))
MICRO, ACCUMULATION, FEATURES, HIDDEN = 64, 4, 256, 1024


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return self.x[i], self.y[i]


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))


def one_round(model: torch.nn.Module, guarded: bool, rank: int = 0, world: int = 1) -> float:
    """Seconds per optimizer step over STEPS steps (after one untimed step)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    n = (STEPS + 1) * MICRO * ACCUMULATION * world
    loader = AdaptiveLoader(Data(n), None, batch_size=MICRO, accumulation=ACCUMULATION, rank=rank, world_size=world)
    ddp = hasattr(model, "no_sync")
    steps, start = 0, 0.0
    for x, y in loader:
        if guarded:
            loader.backward(model, (x, y), lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]))
        else:
            ctx = model.no_sync() if ddp and not loader.sync else contextlib.nullcontext()
            with ctx:
                loss = torch.nn.functional.mse_loss(model(x), y) / loader.window
                loss.backward()
        if loader.sync:
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == 1:
                start = time.perf_counter()
    return (time.perf_counter() - start) / (steps - 1)


def compare(model: torch.nn.Module, rank: int = 0, world: int = 1) -> Dict[str, Any]:
    plain: List[float] = []
    guard: List[float] = []
    for r in range(ROUNDS):
        order = (False, True) if r % 2 == 0 else (True, False)
        for guarded in order:
            if world > 1:
                dist.barrier()
            (guard if guarded else plain).append(one_round(model, guarded, rank, world))
    ratios = [g / p for g, p in zip(guard, plain)]
    return {
        "plain_ms": round(statistics.median(plain) * 1e3, 3),
        "guard_ms": round(statistics.median(guard) * 1e3, 3),
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_min": round(min(ratios), 4),
        "ratio_max": round(max(ratios), 4),
        "rounds": ROUNDS,
        "steps_per_round": STEPS,
    }


def ddp_rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300)
    )
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    result = compare(model, rank, 2)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def main() -> None:
    torch.set_num_threads(1)
    single = compare(mlp())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/memwatch-oom-guard-{os.getpid()}.json"
    mp.spawn(ddp_rank, args=(port, out), nprocs=2, join=True)
    with open(out) as f:
        ddp = json.load(f)
    os.unlink(out)
    print(json.dumps({"torch": torch.__version__, "threads": 1, "single": single, "ddp_2_ranks_gloo": ddp}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
