"""A plain PyTorch loop on memwatch.pytorch.AdaptiveLoader, recording every optimizer step.
usage: torch_train.py CONFIG OUT GO OUTPUT_DIR [urgent]

With `urgent`, the trainer also takes the change in the middle of an epoch when memwatch marks it
urgent (the test stages it so by hand through the daemon's way out is not needed: it checks the
loader's mid-epoch path through `AdaptiveLoader` directly)."""

import json
import os
import sys

import torch

import memwatch
import memwatch.pytorch
import common
from common import Generated, Record, gate, lm_loss, tiny_lm
from memwatch import _proc

cfg_path, out, go, output_dir = sys.argv[1:5]
with open(cfg_path) as f:
    cfg = json.load(f)
train = cfg["train"]
record = Record(out)

client = common.client("torch", cfg_path)
loader = memwatch.pytorch.AdaptiveLoader(
    Generated(),
    client,
    **common.loader_args(train),
)
model = tiny_lm()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
epochs = cfg["epochs"]
total = epochs * len(loader) // loader.accumulation
sched = common.linear_schedule(opt, total)
global_step, samples, gated = 0, 0, False
for epoch in range(epochs):
    for batch in loader:
        loss = lm_loss(model, batch) / loader.window
        loss.backward()
        samples += batch["input_ids"].shape[0]
        if loader.sync:
            opt.step()
            sched.step()
            opt.zero_grad()
            global_step += 1
            record("step", global_step=global_step, samples=samples, micro=loader.micro_batch, accumulation=loader.accumulation)
            samples = 0
            if global_step % 8 == 4:
                record("workers", epoch=epoch, live=_proc.live_workers())
            if not gated:
                gated = True
                gate(go, record, pid=os.getpid(), workers=_proc.live_workers())
record("end", epoch=loader.epoch, global_step=global_step, max_steps=total, scheduler_steps=sched.last_epoch, lr=sched.get_last_lr()[0])
gate(go + ".done", record, kind="finished")
