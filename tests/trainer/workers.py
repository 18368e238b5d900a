#!/usr/bin/python3
"""A stand-in trainer with 4 DataLoader-like worker processes, for memwatch's verification test.

usage: workers.py CONFIG SOCKET URL BALLAST_MIB MODE

It holds BALLAST_MIB of memory (so its cgroup sits at warn), starts 4 workers, attaches itself with its
config (generic profile: workers, pin_memory), and polls for directives. On one, by MODE: "honest"
stops the workers the directive takes away and acknowledges; "liar" keeps all 4 and acknowledges;
"decline" answers that it cannot apply the change, and why.
"""
import json
import multiprocessing as mp
import os
import socket
import sys
import time
import urllib.request

cfg_path, sock_path, url, ballast_mib, mode = sys.argv[1:6]
ballast = b"\x01" * (int(ballast_mib) << 20)
mp.set_start_method("fork")
workers = [mp.Process(target=time.sleep, args=(600,)) for _ in range(4)]
for w in workers:
    w.start()

s = socket.socket(socket.AF_UNIX)
s.connect(sock_path)
s.sendall(json.dumps({
    "cmd": "attach", "pid": os.getpid(), "name": "workers", "config_file": cfg_path,
    "profile": "generic", "keys": ["workers=train.workers", "pin_memory=train.pin_memory"],
}).encode() + b"\n")
reply = json.loads(s.makefile().readline())
if not reply["ok"]:
    sys.exit("attach failed: " + reply["error"])
token = reply["token"]
print("attached", flush=True)


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


generation = 0
while True:
    d = call("GET", f"/api/v1/jobs/workers/directives?since={generation}")
    if d["directives"]:
        with open(cfg_path) as f:
            want = json.load(f)["train"]["workers"]
        generation = d["generation"]
        if mode == "decline":
            call("POST", "/api/v1/jobs/workers/ack",
                 {"generation": generation, "cannot_apply": "workers are fixed until the next start"})
            continue
        if mode == "honest":
            while len(workers) > want:
                w = workers.pop()
                w.terminate()
                w.join()
        call("POST", "/api/v1/jobs/workers/ack", {"generation": generation, "epoch": 1})
    time.sleep(0.2)
