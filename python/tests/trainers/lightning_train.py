"""A Lightning run with `callbacks=[MemwatchCallback()]`, recording every optimizer step.
usage: lightning_train.py CONFIG OUT GO OUTPUT_DIR [ddp]

With `ddp`: one rank of a DDP job over two nodes of one device each (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment, as on one node of each; gloo on CPU), its job named `lightning<RANK>`."""

import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader

import memwatch.lightning
import common
from common import Generated, Record, gate, lm_loss, tiny_lm
from memwatch import _proc

cfg_path, out, go, output_dir = sys.argv[1:5]
ddp = sys.argv[5:6] == ["ddp"]
if ddp:
    os.environ["NODE_RANK"] = os.environ["RANK"]
with open(cfg_path) as f:
    cfg = json.load(f)
train = cfg["train"]
record = Record(out)


class Data(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.batch_size = train["micro_batch"]
        self.num_workers = train["workers"]
        self.pin_memory = train["pin_memory"]
        self.data = Generated()

    def train_dataloader(self):
        return DataLoader(
            self.data, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers, pin_memory=self.pin_memory
        )


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = tiny_lm()
        self.samples = 0
        self.gated = False

    def training_step(self, batch, batch_idx):
        self.samples += batch["input_ids"].shape[0]
        return lm_loss(self.model, batch)

    def on_before_optimizer_step(self, optimizer):
        t = self.trainer
        record(
            "step",
            global_step=t.global_step + 1,
            samples=self.samples,
            micro=t.datamodule.batch_size,
            accumulation=t.accumulate_grad_batches,
        )
        self.samples = 0
        if (t.global_step + 1) % 8 == 4:
            record("workers", epoch=t.current_epoch, live=_proc.live_workers())
        if not self.gated:
            self.gated = True
            gate(go, record, pid=os.getpid(), workers=_proc.live_workers())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        total = self.trainer.estimated_stepping_batches
        sched = common.linear_schedule(opt, total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


client = common.client(f"lightning{os.environ['RANK']}" if ddp else "lightning", cfg_path)
module = Tiny()
trainer = L.Trainer(
    max_epochs=cfg["epochs"],
    accumulate_grad_batches=train["accumulation"],
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    default_root_dir=output_dir,
    callbacks=[memwatch.lightning.MemwatchCallback(client)],
    **({"strategy": "ddp", "num_nodes": 2, "devices": 1} if ddp else {}),
)
trainer.fit(module, datamodule=Data())
sched = trainer.lr_scheduler_configs[0].scheduler
record(
    "end",
    epoch=trainer.current_epoch,
    global_step=trainer.global_step,
    max_steps=trainer.estimated_stepping_batches,
    scheduler_steps=sched.last_epoch,
    lr=sched.get_last_lr()[0],
    checksum=float(sum(p.detach().double().sum() for p in module.parameters())),
)
gate(go + ".done", record, kind="finished")
