"""A transformers.Trainer run whose 4 DataLoader workers each fill a 160 MiB cache as they start: it fits
an 850 MiB cgroup with 2 workers, not 4. Run under `memwatch launch`; on a relaunch
(MEMWATCH_RESUME=1) it resumes from the Trainer's last checkpoint. usage: hf_way_out.py CONFIG OUT"""

import json
import os
import sys
import time

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

import memwatch
import memwatch.hf
from common import Record
from memwatch import _proc

cfg_path, out = sys.argv[1:3]
with open(cfg_path) as f:
    cfg = json.load(f)
record = Record(out)
torch.manual_seed(0)
features, labels = torch.randn(4096, 64), torch.randint(0, 10, (4096,))
CACHE = []


class Samples(Dataset):
    def __len__(self):
        return len(features)

    def __getitem__(self, i):
        if not CACHE and torch.utils.data.get_worker_info() is not None:
            for _ in range(16):  # a shard cache that fills within a second or two
                CACHE.append(os.urandom(10 << 20))
                time.sleep(0.1)
        time.sleep(0.004)
        return {"x": features[i], "labels": labels[i]}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def forward(self, x, labels):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Probe(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step % 8 == 0:
            record("workers", step=state.global_step, live=_proc.live_workers(),
                   configured=args.dataloader_num_workers)

    def on_save(self, args, state, control, **kw):
        record("saved", step=state.global_step)

    def on_train_end(self, args, state, control, **kw):
        record("end", global_step=state.global_step, max_steps=state.max_steps, epoch=state.epoch)


callback = memwatch.hf.MemwatchCallback(name="hf-way-out")
output = out + ".output"
args = TrainingArguments(output_dir=output, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                         logging_strategy="no", learning_rate=0.05, **cfg)
trainer = Trainer(model=Model(), args=args, train_dataset=Samples(), callbacks=[Probe(), callback])
record("start", resumed=callback.client.resumed, workers=args.dataloader_num_workers)
trainer.train(resume_from_checkpoint=callback.client.resumed or None)
