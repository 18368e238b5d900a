"""A plain PyTorch job whose DataLoader workers fill a cache as soon as they start, for memwatch's way-out
tests: it fits its memory cgroup with 2 workers, not with 4.

usage: dataloader.py CONFIG OUT MODE [RESUME]

CONFIG is JSON: {"train": {"micro_batch": 32, "accumulation": 2, "workers": 4, "pin_memory": true},
"epochs": 3, "samples": 2048, "cache_mib": 160, "step_ms": 20}. OUT receives a JSON account at the end.
MODE:
  protocol  attaches itself over memwatch's control socket (MEMWATCH_SOCKET) and speaks
            docs/protocol.md over HTTP (MEMWATCH_URL): it asks for directives at every step, applies
            an urgent worker or pin_memory change at once (a new DataLoader over the samples this
            epoch has not seen yet), a micro-batch change at an accumulation boundary, and saves a
            checkpoint when asked.
  plain     knows nothing of memwatch: reads CONFIG once at start, saves a checkpoint at every epoch
            end and on SIGUSR1, and resumes from it when RESUME is 1 (`memwatch launch ... {resume}`).
"""
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

import torch
from torch.utils.data import DataLoader, Dataset

cfg_path, out_path, mode = sys.argv[1:4]
resume = len(sys.argv) > 4 and sys.argv[4] == "1"
ckpt_path = out_path + ".ckpt"
with open(cfg_path) as f:
    whole = json.load(f)
cfg = whole["train"]
epochs, samples = whole["epochs"], whole["samples"]
cache_mib, step_ms = whole["cache_mib"], whole["step_ms"]

torch.manual_seed(0)
features = torch.randn(samples, 64)
labels = torch.randint(0, 10, (samples,))


class Samples(Dataset):
    def __init__(self, indices):
        self.indices = indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        j = self.indices[i]
        return features[j], labels[j], j


CACHE = []


def fill_cache(_worker_id):
    # What a real loader's shard cache or decoded-image cache does: fill up within a second.
    for _ in range(cache_mib // 10):
        CACHE.append(os.urandom(10 << 20))
        time.sleep(0.1)


def loader(indices, c):
    return DataLoader(Samples(indices), batch_size=c["micro_batch"], shuffle=False,
                      num_workers=c["workers"], pin_memory=c["pin_memory"],
                      worker_init_fn=fill_cache if c["workers"] else None)


model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
account = {"workers": [], "micro_batch": [], "effective": [], "optimizer_steps": 0,
           "epochs_done": 0, "urgent": 0, "checkpoints": 0, "resumed": resume}
start_epoch, seen = 0, []


def save_checkpoint(epoch, seen_now):
    tmp = ckpt_path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                "seen": list(seen_now), "account": account}, tmp)
    os.replace(tmp, ckpt_path)
    account["checkpoints"] += 1
    print(f"checkpoint saved at epoch {epoch}, {len(seen_now)} samples in", flush=True)


if resume and os.path.exists(ckpt_path):
    state = torch.load(ckpt_path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start_epoch, seen = state["epoch"], state["seen"]
    account.update({k: v for k, v in state["account"].items() if k != "resumed"})
    print(f"resumed at epoch {start_epoch} with {len(seen)} samples seen", flush=True)

token, url, job = None, os.environ.get("MEMWATCH_URL", "http://127.0.0.1:9300"), "dataloader"


def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"memwatch refused {method} {path}: {e.code} {e.read().decode()}") from e


if mode == "protocol":
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["MEMWATCH_SOCKET"])
    s.sendall(json.dumps({
        "cmd": "attach", "pid": os.getpid(), "name": job, "config_file": os.path.abspath(cfg_path),
        "profile": "generic",
        "keys": ["batch=train.micro_batch", "accumulation=train.accumulation",
                 "workers=train.workers", "pin_memory=train.pin_memory"],
    }).encode() + b"\n")
    reply = json.loads(s.makefile().readline())
    if not reply["ok"]:
        sys.exit("attach failed: " + reply["error"])
    token = reply["token"]
else:
    current = {"epoch": 0, "seen": []}
    signal.signal(signal.SIGUSR1,
                  lambda *_: save_checkpoint(current["epoch"], current["seen"]))

generation, staged = 0, None
for epoch in range(start_epoch, epochs):
    if mode == "protocol" and staged is not None:
        cfg, staged = staged, None
        call("POST", f"/api/v1/jobs/{job}/ack", {"generation": generation, "epoch": epoch})
    seen_set = set(seen)
    order = [i for i in range(samples) if i not in seen_set]
    accum = cfg["accumulation"]
    it = iter(loader(order, cfg))
    account["workers"].append(cfg["workers"])
    micro, window = 0, []
    opt.zero_grad()
    while True:
        try:
            x, y, idx = next(it)
        except StopIteration:
            break
        loss = torch.nn.functional.cross_entropy(model(x), y) / accum
        loss.backward()
        micro += 1
        window.extend(idx.tolist())
        if micro % accum == 0:
            opt.step()
            opt.zero_grad()
            seen.extend(window)     # a sample counts as seen once its optimizer step is done
            window = []
            account["optimizer_steps"] += 1
            account["effective"].append(cfg["micro_batch"] * accum)
        if mode == "plain":
            current["epoch"], current["seen"] = epoch, list(seen)
        time.sleep(step_ms / 1000)
        if mode != "protocol":
            continue
        d = call("GET", f"/api/v1/jobs/{job}/directives?since={generation}")
        if d.get("checkpoint"):
            save_checkpoint(epoch, seen)
            call("POST", f"/api/v1/jobs/{job}/ack", {"checkpoint": True})
        if not d["directives"]:
            continue
        generation = d["generation"]
        with open(cfg_path) as f:
            new = json.load(f)["train"]
        if not any(x.get("urgent") for x in d["directives"]):
            staged = new            # the next epoch boundary
            continue
        # Urgent: workers, pin_memory and the micro-batch now, at an accumulation boundary: a
        # partial window is dropped and its samples come again.
        opt.zero_grad()
        window = []
        del it                      # the old workers exit, and their caches with them
        cfg, accum = new, new["accumulation"]
        seen_set = set(seen)
        order = [i for i in order if i not in seen_set]
        it = iter(loader(order, cfg))
        account["workers"].append(cfg["workers"])
        account["urgent"] += 1
        micro = 0
        call("POST", f"/api/v1/jobs/{job}/ack", {"generation": generation, "epoch": epoch})
        print(f"urgent: generation {generation} applied mid-epoch {epoch}: {cfg}", flush=True)
    if micro % accum:
        opt.step()
        opt.zero_grad()
    seen = []
    account["epochs_done"] = epoch + 1
    if mode == "plain":
        save_checkpoint(epoch + 1, [])

account["micro_batch"] = cfg["micro_batch"]
account["accumulation"] = cfg["accumulation"]
with open(out_path, "w") as f:
    json.dump(account, f)
print("done", json.dumps(account["workers"]), flush=True)
