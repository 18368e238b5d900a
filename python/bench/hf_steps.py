"""One transformers.Trainer run on the tiny random GPT-2 of the tests, for scripts/bench-python.sh.
usage: hf_steps.py CONFIG OUT MODE   (MODE: memwatch, or none: attached without the callback)

Writes one JSON line per optimizer step to OUT: the wall-clock time (ms) and the micro-batch it ran with.
"""

import json
import sys
import time

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests/trainers")
from common import Generated  # noqa: E402

cfg_path, out, mode = sys.argv[1:4]
with open(cfg_path) as f:
    cfg = json.load(f)
log = open(out, "w", buffering=1)


class Clock(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        log.write(json.dumps({"ms": time.time() * 1000, "micro": args.per_device_train_batch_size,
                              "step": state.global_step, "epoch": state.epoch}) + "\n")


callbacks = [Clock()]
if mode == "memwatch":
    import memwatch.hf

    callbacks.append(memwatch.hf.MemwatchCallback(config_file=cfg_path, name="bench"))
else:
    # Attached all the same, so that the daemon measures this job in both modes: the difference is
    # the callback's alone.
    import memwatch

    memwatch.Client("bench", config_file=cfg_path, profile="hf").attach()
torch_model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=128, n_positions=16))
args = TrainingArguments(output_dir="/tmp/memwatch-bench-hf", report_to=[], save_strategy="no", use_cpu=True,
                         disable_tqdm=True, logging_strategy="no", **cfg)
Trainer(model=torch_model, args=args, train_dataset=Generated(), callbacks=callbacks).train()
