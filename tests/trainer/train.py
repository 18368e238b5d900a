#!/usr/bin/env python3
"""A stand-in trainer for memwatch's end-to-end test of the epoch-boundary protocol (no ML here; see
docs/protocol.md for the same loop around a real PyTorch model).

usage: train.py CONFIG SOCKET URL OUT EPOCHS STEPS_PER_EPOCH STEP_SECONDS

It attaches itself (with its config file and the generic profile), trains EPOCHS epochs of
STEPS_PER_EPOCH steps, and at every epoch boundary asks for directives, re-reads its config, applies and
acknowledges. It writes what it used at every step to OUT as JSON.
"""
import json
import os
import socket
import sys
import time
import urllib.request

cfg_path, sock_path, url, out_path = sys.argv[1:5]
epochs, steps, step_s = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])


def attach():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock_path)
    req = {
        "cmd": "attach", "pid": os.getpid(), "name": "trainer", "config_file": cfg_path,
        "profile": "generic", "keys": ["batch=train.micro_batch", "accumulation=train.accumulation"],
    }
    s.sendall(json.dumps(req).encode() + b"\n")
    reply = json.loads(s.makefile().readline())
    if not reply["ok"]:
        sys.exit("attach failed: " + reply["error"])
    return reply["token"]


token = attach()


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def knobs():
    with open(cfg_path) as f:
        t = json.load(f)["train"]
    return t["micro_batch"], t["accumulation"]


micro, accum = knobs()
generation = 0
log = []
for epoch in range(epochs):
    # The epoch boundary: the only place the batch may change.
    d = call("GET", f"/api/v1/jobs/trainer/directives?since={generation}")
    if d["directives"]:
        micro, accum = knobs()
        generation = d["generation"]
        call("POST", "/api/v1/jobs/trainer/ack", {"generation": generation, "epoch": epoch})
    start = time.time()
    for step in range(steps):
        log.append({"epoch": epoch, "step": step, "micro": micro, "accum": accum,
                    "t_ms": int(time.time() * 1000)})
        time.sleep(step_s)
        if step % 5 == 0:
            call("POST", "/api/v1/jobs/trainer/progress", {
                "epoch": epoch, "step": step, "loss": 1.0 / (1 + epoch * steps + step),
                "samples_per_second": micro * accum / step_s})
with open(out_path, "w") as f:
    json.dump(log, f)
