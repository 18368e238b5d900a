"""A Lightning run whose model runs out of memory in a step (oom_model.Budgeted, from its 3rd batch),
with MemwatchCallback attached to memwatch with its config file. usage: oom_lightning.py CONFIG CKPT"""

from __future__ import annotations

import json
import os
import sys

import lightning.pytorch as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oom_model import Budgeted, Indexed, mse  # noqa: E402

import memwatch  # noqa: E402
import memwatch.lightning  # noqa: E402

cfg_path, ckpt = sys.argv[1:3]
with open(cfg_path) as f:
    train = json.load(f)["train"]


class Module(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Budgeted()
        self.batch_size = train["micro_batch"]
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if self.steps >= 3:
            self.model.forward_budget = self.batch_size // 2
        return mse(self.model, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Indexed(64), batch_size=self.batch_size)


client = memwatch.Client("oomlight", config_file=cfg_path, keys=["batch=train.micro_batch", "accumulation=train.accumulation"])
trainer = pl.Trainer(
    max_epochs=1, accelerator="cpu", devices=1, accumulate_grad_batches=train["accumulation"], logger=False,
    enable_checkpointing=False, enable_progress_bar=False, default_root_dir=os.path.dirname(ckpt),
    callbacks=[memwatch.lightning.MemwatchCallback(client, checkpoint_path=ckpt)],
)
trainer.fit(Module())
