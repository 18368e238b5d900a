"""A transformers.Trainer run on a tiny random GPT-2 (nothing downloaded), recording every optimizer
step. usage: hf_train.py CONFIG OUT GO OUTPUT_DIR MODE  (MODE: memwatch, by-env, ddp, naive or none)

memwatch: `callbacks=[MemwatchCallback()]`, the one line. by-env: the same with no name, so that the
job is named by `MEMWATCH_JOB`. ddp: one rank of a DDP job (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment; gloo on CPU), the callback's job named `hf<RANK>`. naive: the callback a user would write from the protocol doc, which
sets `num_workers` on the DataLoader the Trainer hands it and acknowledges.
"""

import json
import os
import sys

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

import memwatch
import memwatch.hf
from common import Generated, Record, gate
from memwatch import _proc

cfg_path, out, go, output_dir, mode = sys.argv[1:6]
with open(cfg_path) as f:
    cfg = json.load(f)
record = Record(out)

model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=16))
seen = {"samples": 0}


def count(module, args, kwargs):
    seen["samples"] += kwargs["input_ids"].shape[0]


model.register_forward_pre_hook(count, with_kwargs=True)


class Probe(TrainerCallback):
    """Records what each optimizer step was made of, and the live DataLoader workers."""

    gated = False

    def on_optimizer_step(self, args, state, control, **kw):
        record(
            "step",
            global_step=state.global_step + 1,
            samples=seen["samples"],
            micro=args.per_device_train_batch_size,
            accumulation=args.gradient_accumulation_steps,
        )
        seen["samples"] = 0

    def on_step_end(self, args, state, control, **kw):
        record("epoch", epoch=state.epoch, global_step=state.global_step)
        if state.global_step % 8 == 4:
            record("workers", epoch=int(state.epoch), live=_proc.live_workers())
        if not self.gated:
            self.gated = True
            gate(go, record, pid=os.getpid(), workers=_proc.live_workers())

    def on_train_end(self, args, state, control, lr_scheduler=None, **kw):
        record(
            "end",
            epoch=state.epoch,
            global_step=state.global_step,
            max_steps=state.max_steps,
            scheduler_steps=lr_scheduler.last_epoch,
            lr=lr_scheduler.get_last_lr()[0],
            checksum=float(sum(p.detach().double().sum() for p in model.parameters())),
        )


class Naive(TrainerCallback):
    """What the protocol doc leads a user to write without knowing Trainer internals."""

    def __init__(self):
        self.client = memwatch.Client("hf", config_file=cfg_path, profile="hf")
        self.client.attach()

    def on_epoch_begin(self, args, state, control, train_dataloader=None, **kw):
        d = self.client.directives(force=True)
        if d is not None and d.pending:
            new = d.new_values()
            if "workers" in new:
                train_dataloader.num_workers = new["workers"]
            self.client.ack(d.generation, int(state.epoch))


callbacks = [Probe()]
if mode == "memwatch":
    callbacks.append(memwatch.hf.MemwatchCallback(config_file=cfg_path, name="hf"))
elif mode == "ddp":
    callbacks.append(memwatch.hf.MemwatchCallback(config_file=cfg_path, name=f"hf{os.environ['RANK']}"))
elif mode == "by-env":
    callbacks.append(memwatch.hf.MemwatchCallback(config_file=cfg_path))
elif mode == "naive":
    callbacks.append(Naive())

args = TrainingArguments(
    output_dir=output_dir,
    report_to=[],
    save_strategy="no",
    logging_steps=10,
    learning_rate=1e-3,
    lr_scheduler_type="linear",
    use_cpu=True,
    disable_tqdm=True,
    **({"ddp_backend": "gloo"} if mode == "ddp" else {}),
    **cfg,
)
trainer = Trainer(model=model, args=args, train_dataset=Generated(), callbacks=callbacks)
trainer.train()
done = go + ".done"
gate(done, record, kind="finished")
