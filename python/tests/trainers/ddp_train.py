"""One rank of a DDP job (gloo, CPU) on memwatch.pytorch.AdaptiveLoader, recording every optimizer
step. usage: ddp_train.py CONFIG OUT GO OUTPUT_DIR (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
the environment, as torchrun and srun set them). Each rank is its own memwatch job (`ddp<RANK>`),
with its own config file, as the ranks of a job over several nodes each talk to their node's
memwatch; the test puts one rank's node under pressure."""

import json
import os
import sys

import torch
import torch.distributed as dist

import memwatch
import memwatch.pytorch
import common
from common import Generated, Record, gate, lm_loss, tiny_lm
from memwatch import _proc

cfg_path, out, go, output_dir = sys.argv[1:5]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(cfg_path) as f:
    cfg = json.load(f)
train = cfg["train"]
record = Record(out)

dist.init_process_group("gloo", rank=rank, world_size=world)
client = common.client(f"ddp{rank}", cfg_path)
loader = memwatch.pytorch.AdaptiveLoader(
    Generated(),
    client,
    rank=rank,
    world_size=world,
    **common.loader_args(train),
)
model = torch.nn.parallel.DistributedDataParallel(tiny_lm())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
epochs = cfg["epochs"]
global_step, samples, gated = 0, 0, False
for epoch in range(epochs):
    for batch in loader:
        if loader.sync:
            loss = lm_loss(model, batch) / loader.window
            loss.backward()
        else:
            with model.no_sync():
                loss = lm_loss(model, batch) / loader.window
                loss.backward()
        samples += batch["input_ids"].shape[0]
        if loader.sync:
            opt.step()
            opt.zero_grad()
            global_step += 1
            record("step", global_step=global_step, samples=samples, micro=loader.micro_batch, accumulation=loader.accumulation)
            samples = 0
            if global_step % 8 == 4:
                record("workers", epoch=epoch, live=_proc.live_workers())
            if not gated:
                gated = True
                gate(go, record, pid=os.getpid(), workers=_proc.live_workers())
# The ranks' weights, which DDP keeps equal only while every rank takes part in every all-reduce.
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
record("end", epoch=loader.epoch, global_step=global_step, checksum=checksum)
gate(go + ".done", record, kind="finished")
dist.destroy_process_group()
