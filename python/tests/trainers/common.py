"""What every test trainer shares: generated data whose DataLoader workers each hold real memory,
a record of every optimizer step, and a gate the test opens."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict

import torch
from torch.utils.data import Dataset

SAMPLES = 512
BALLAST_MIB = int(os.environ.get("BALLAST_MIB", "48"))
ITEM_SECONDS = float(os.environ.get("ITEM_SECONDS", "0.004"))

_ballast = None


class Generated(Dataset):
    """Random tokens (nothing downloaded). Each process that loads an item holds BALLAST_MIB of
    memory of its own: the DataLoader workers, not the trainer, fill the cgroup."""

    def __init__(self, n: int = SAMPLES, length: int = 16, vocab: int = 128) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        global _ballast
        if _ballast is None and torch.utils.data.get_worker_info() is not None:
            _ballast = b"\x01" * (BALLAST_MIB << 20)
        time.sleep(ITEM_SECONDS)
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Record:
    """JSON lines for the test: one per optimizer step, and a few events."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)

    def __call__(self, kind: str, **fields: Any) -> None:
        self.f.write(json.dumps(dict(kind=kind, **fields)) + "\n")


def gate(path: str, record: Record, kind: str = "ready", **fields: Any) -> None:
    """Says where it is (`kind`, with `fields`) and waits until the test creates `path`."""
    record(kind, **fields)
    end = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit("the test never opened the gate")
        time.sleep(0.02)


KEYS = [
    "batch=train.micro_batch",
    "accumulation=train.accumulation",
    "workers=train.workers",
    "pin_memory=train.pin_memory",
]


def client(name: str, cfg_path: str) -> Any:
    """The run's memwatch client, attached with its config (generic profile, the knobs under `train`)."""
    import memwatch

    c = memwatch.Client(name, config_file=cfg_path, keys=KEYS)
    c.attach()
    return c


def loader_args(train: Dict[str, Any]) -> Dict[str, Any]:
    """The config's `train` knobs as an AdaptiveLoader's starting values."""
    return {
        "batch_size": train["micro_batch"],
        "accumulation": train["accumulation"],
        "num_workers": train["workers"],
        "pin_memory": train["pin_memory"],
    }


def linear_schedule(opt: torch.optim.Optimizer, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear decay to 0 over `total` optimizer steps."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))


def tiny_lm(vocab: int = 128) -> torch.nn.Module:
    """A tiny language model for the plain loops: embedding, one layer, head."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(vocab, 32), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, vocab)
    )


def lm_loss(model: torch.nn.Module, batch: Dict[str, Any]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
