"""A plain loop on AdaptiveLoader.backward whose model runs out of memory (oom_model.Budgeted), attached
to memwatch with its config file. usage: oom_train.py CONFIG OUT CHECKPOINT [GATE]

The config's `oom` says when: `{"from": K, "forward": N}` makes every forward pass of over N samples
raise `torch.OutOfMemoryError` from the K-th micro-batch on (only in the first run under `memwatch
launch`, as when a second job leaves the GPU before the relaunch). Records each optimizer step's
weights (OUT, one JSON line each); saves its checkpoint to CHECKPOINT and resumes from it when
`MEMWATCH_RESUME` is 1. With GATE, waits at its end until the test creates that file (so the job is
still attached while the test reads memwatch's view of it)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oom_model import Budgeted, Indexed, mse  # noqa: E402

import memwatch  # noqa: E402
from memwatch.pytorch import AdaptiveLoader  # noqa: E402

cfg_path, out, checkpoint_path = sys.argv[1:4]
gate = sys.argv[4] if len(sys.argv) > 4 else None
with open(cfg_path) as f:
    cfg = json.load(f)
train = cfg["train"]
budget = cfg.get("oom", {})
first_run = os.environ.get("MEMWATCH_RESTART", "0") == "0"

client = memwatch.Client(
    os.environ.get("MEMWATCH_JOB", "oom"),
    config_file=cfg_path,
    keys=["batch=train.micro_batch", "accumulation=train.accumulation"],
)
model = Budgeted()
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def save(state):
    torch.save({"loader": state, "model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_path)


loader = AdaptiveLoader(
    Indexed(64),
    client,
    batch_size=train["micro_batch"],
    accumulation=train["accumulation"],
    seed=3,
    checkpoint=save,
    min_micro_batch=train.get("min_micro_batch", 1),
)
if client.resumed and os.path.exists(checkpoint_path):
    saved = torch.load(checkpoint_path)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    loader.load_state_dict(saved["loader"])
record = open(out, "a", buffering=1)
record.write(json.dumps({"kind": "start", "resumed": client.resumed, "micro": loader.micro_batch,
                         "accumulation": loader.accumulation, "epoch": loader.epoch, "position": loader.position}) + "\n")
count = 0
while loader.epoch < cfg["epochs"]:
    for batch in loader:
        if first_run and budget and count >= budget["from"]:
            model.forward_budget = budget["forward"]
        count += 1
        loader.backward(model, batch, lambda b: mse(model, b))
        if loader.sync:
            opt.step()
            opt.zero_grad()
            record.write(json.dumps({
                "kind": "step", "epoch": loader.epoch, "micro": loader.micro_batch, "accumulation": loader.accumulation,
                "weights": [p.detach().flatten().tolist() for p in model.parameters()],
            }) + "\n")
record.write(json.dumps({"kind": "end"}) + "\n")
if gate:
    end = time.monotonic() + 120
    while not os.path.exists(gate) and time.monotonic() < end:
        time.sleep(0.02)
