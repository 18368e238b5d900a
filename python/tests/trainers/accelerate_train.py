"""An accelerate script (`accelerator.accumulate`) on memwatch.accelerate.AcceleratedLoader, recording
every optimizer step. usage: accelerate_train.py CONFIG OUT GO OUTPUT_DIR"""

import json
import os
import sys

import torch
from accelerate import Accelerator

import memwatch
import memwatch.accelerate
import common
from common import Generated, Record, gate, lm_loss, tiny_lm
from memwatch import _proc

cfg_path, out, go, output_dir = sys.argv[1:5]
with open(cfg_path) as f:
    cfg = json.load(f)
train = cfg["train"]
record = Record(out)

client = common.client("accelerate", cfg_path)
accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=memwatch.accelerate.gradient_accumulation_plugin(client))
assert accelerator.gradient_accumulation_steps == train["accumulation"]
loader = memwatch.accelerate.AcceleratedLoader(
    accelerator,
    Generated(),
    client,
    **common.loader_args(train),
)
model = tiny_lm()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
epochs = cfg["epochs"]
total = epochs * len(loader) // loader.accumulation
sched = common.linear_schedule(opt, total)
model, opt, sched = accelerator.prepare(model, opt, sched)
global_step, samples, gated = 0, 0, False
for epoch in range(epochs):
    for batch in loader:
        with accelerator.accumulate(model):
            loss = lm_loss(model, batch)
            accelerator.backward(loss)
            samples += batch["input_ids"].shape[0]
            opt.step()
            sched.step()
            opt.zero_grad()
        if accelerator.sync_gradients:
            assert loader.sync, "accelerate stepped inside a window"
            global_step += 1
            record("step", global_step=global_step, samples=samples, micro=loader.micro_batch, accumulation=loader.accumulation)
            samples = 0
            if global_step % 8 == 4:
                record("workers", epoch=epoch, live=_proc.live_workers())
            if not gated:
                gated = True
                gate(go, record, pid=os.getpid(), workers=_proc.live_workers())
inner = sched.scheduler
record("end", epoch=loader.epoch, global_step=global_step, max_steps=total, scheduler_steps=inner.last_epoch, lr=inner.get_last_lr()[0])
gate(go + ".done", record, kind="finished")
