"""A plain PyTorch job on memwatch.pytorch.AdaptiveLoader whose DataLoader workers fill a 160 MiB cache
as soon as they start: it fits an 850 MiB cgroup with 2 workers, not with 4, so memwatch pauses it in
its first epoch and must find a way out. usage: way_out_train.py CONFIG OUT

It applies an urgent change mid-epoch (the loader does), saves a checkpoint when memwatch asks (the
loader calls `save`), and resumes from it when `memwatch launch` relaunched it (MEMWATCH_RESUME=1)."""

import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset

import memwatch
import memwatch.pytorch
import common
from common import Record
from memwatch import _proc

cfg_path, out = sys.argv[1:3]
ckpt = out + ".ckpt"
with open(cfg_path) as f:
    whole = json.load(f)
train = whole["train"]
record = Record(out)
torch.manual_seed(0)
features, labels = torch.randn(2048, 64), torch.randint(0, 10, (2048,))


class Samples(Dataset):
    def __len__(self):
        return len(features)

    def __getitem__(self, i):
        return features[i], labels[i]


CACHE = []


def fill_cache(_worker):
    # What a real loader's shard or decoded-image cache does: fill up within a second or two.
    for _ in range(16):
        CACHE.append(os.urandom(10 << 20))
        time.sleep(0.1)


client = common.client("way-out", cfg_path)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def save(loader_state):
    tmp = ckpt + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader_state}, tmp)
    os.replace(tmp, ckpt)
    record("checkpoint", **loader_state)


loader = memwatch.pytorch.AdaptiveLoader(
    Samples(),
    client,
    **common.loader_args(train),
    checkpoint=save,
    worker_init_fn=fill_cache,
)
if client.resumed and os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    loader.load_state_dict(state["loader"])
    record("resumed", epoch=loader.epoch, position=loader.position, workers=loader.num_workers)

samples = 0
while loader.epoch < whole["epochs"]:
    epoch = loader.epoch
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y) / loader.window
        loss.backward()
        samples += len(x)
        time.sleep(0.02)
        if loader.sync:
            opt.step()
            opt.zero_grad()
            record("step", epoch=epoch, position=loader.position, samples=samples, micro=loader.micro_batch,
                   accumulation=loader.accumulation, workers=loader.num_workers, rebuilds=loader.rebuilds)
            samples = 0
record("end", epochs=loader.epoch, live=_proc.live_workers())
