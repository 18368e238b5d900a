"""Two DDP ranks (gloo, CPU, torch.multiprocessing.spawn) on AdaptiveLoader.backward, one of which runs
out of memory. usage: oom_ddp.py OUT_DIR CASE MICRO ACCUMULATION

CASE: reference (no OOM), forward (rank 1's forward pass, from its 3rd micro-batch), backward (rank
1's backward pass without gradient sync, from its 5th), synced (rank 1's backward pass that
synchronises gradients: accumulation 1). Each rank saves what it trained (OUT_DIR/rank<R>.pt); a rank
that stops saves its checkpoint (OUT_DIR/checkpoint.pt). Prints one JSON line: how the job ended and
how long it took."""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oom_model import Budgeted, Indexed, mse, weights  # noqa: E402

import memwatch.oom  # noqa: E402
from memwatch.pytorch import AdaptiveLoader  # noqa: E402

COLLECTIVE_TIMEOUT_S = 600


def rank_main(rank: int, out: str, case: str, micro: int, accumulation: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    inner = Budgeted()
    model = torch.nn.parallel.DistributedDataParallel(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def checkpoint(state: Dict[str, Any]) -> None:
        torch.save({"loader": state, "model": inner.state_dict()}, os.path.join(out, "checkpoint.pt"))

    loader = AdaptiveLoader(
        Indexed(64), None, batch_size=micro, accumulation=accumulation, seed=3, rank=rank, world_size=2,
        checkpoint=checkpoint,
    )
    steps: List[List[torch.Tensor]] = []
    shapes: List[List[int]] = []
    handed: List[int] = []
    count = 0
    for _ in range(2):
        for batch in loader:
            if rank == 1 and case == "forward":
                inner.forward_budget = micro // 2 if count >= 2 else None
            if rank == 1 and case in ("backward", "synced"):
                # The 5th micro-batch begins a window: its backward pass runs without gradient sync
                # at accumulation 2, and with it at accumulation 1.
                inner.backward_budget = micro // 2 if count >= 4 else None
            count += 1
            handed.extend(int(i) for i in batch[2])
            loader.backward(model, batch, lambda b: mse(model, b))
            if loader.sync:
                opt.step()
                opt.zero_grad()
                steps.append(weights(inner))
                shapes.append([loader.micro_batch, loader.accumulation])
    torch.save(
        {
            "steps": steps,
            "shapes": shapes,
            "handed": handed,
            "ooms": [(o.phase, o.micro_batch_before, o.micro_batch_after, o.own) for o in loader.ooms],
            "agreements": loader._guard.agreements if loader._guard else 0,
        },
        os.path.join(out, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()


def main() -> None:
    out, case, micro, accumulation = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    ended, error = "finished", None
    try:
        mp.spawn(rank_main, args=(out, case, micro, accumulation, port), nprocs=2, join=True)
    except mp.ProcessRaisedException as e:
        ended, error = "raised", str(e)
    except mp.ProcessExitedException as e:
        ended, error = "exited", str(e)
    print(json.dumps({"ended": ended, "seconds": time.monotonic() - start, "error": error}))


if __name__ == "__main__":
    main()
