"""A DDP job of two ranks (gloo on CPU, one rank per memory cgroup, each rank its own memwatch job
as on two nodes) of which one rank's memwatch asks for a change: every rank takes the same
micro-batch and accumulation from the same optimizer step, the effective batch stays the same, DDP
stays in step (equal weights at the end) and the job finishes. A plain PyTorch loop on
`AdaptiveLoader`, transformers' Trainer and Lightning's, each with its `MemwatchCallback`."""

import importlib.util
import json
import socket

import pytest

from conftest import eventually, python, TRAINERS
from scenario import CONFIG, GENERIC, HF, read

CASES = [
    ("torch", "ddp_train.py", GENERIC, "ddp", [], "torch"),
    ("hf", "hf_train.py", HF, "hf", ["ddp"], "transformers"),
    ("lightning", "lightning_train.py", GENERIC, "lightning", ["ddp"], "lightning"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case,script,config,prefix,args,framework", CASES, ids=[c[0] for c in CASES])
def test_every_rank_takes_the_change_one_rank_was_asked_for(
    daemon_factory, cgroup_factory, tmp_path, case, script, config, prefix, args, framework
):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    d = daemon_factory(CONFIG)
    port = _free_port()
    go = tmp_path / "go"
    ranks = []
    for rank in range(2):
        cfg = tmp_path / f"train{rank}.json"
        cfg.write_text(json.dumps(config))
        out = tmp_path / f"out{rank}.jsonl"
        cg = cgroup_factory()
        env = dict(
            d.env(), RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        argv = [python(), str(TRAINERS / script), str(cfg), str(out), str(go), str(tmp_path / f"output{rank}"), *args]
        ranks.append((cg, out, cg.spawn(argv, env)))
    jobs = [f"{prefix}{rank}" for rank in range(2)]
    try:
        def at(kind: str) -> bool:
            return all(any(r["kind"] == kind for r in read(out)) for _, out, _ in ranks)

        def failed() -> bool:
            return any(p.poll() not in (None, 0) for _, _, p in ranks)

        eventually(180, lambda: at("ready") or failed(), "the ranks never reached their first step")
        assert not failed(), [p.returncode for _, _, p in ranks]
        for name in jobs:
            eventually(20, lambda: d.job(name), f"{name} was never attached")
        # Rank 0's node only: its GPU at 92 % and its cgroup at 86 % (warn).
        cg0, _, p0 = ranks[0]
        d.set_gpu(p0.pid, 0.92)
        cg0.set_limit(int(cg0.unreclaimable() / 0.86))
        eventually(
            30,
            lambda: (d.job(jobs[0]) or {}).get("config", {}).get("directives"),
            "memwatch staged no change for rank 0",
        )
        go.touch()
        eventually(300, lambda: at("finished") or failed(), "the ranks never finished")
        assert not failed(), [p.returncode for _, _, p in ranks]
        job0, job1 = d.job(jobs[0]), d.job(jobs[1])
        (tmp_path / "go.done").touch()
        rcs = [p.wait(60) for _, _, p in ranks]
    finally:
        for _, _, p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert rcs == [0, 0]
    runs = [read(out) for _, out, _ in ranks]
    steps = [[r for r in run if r["kind"] == "step"] for run in runs]
    # Only rank 0's memwatch asked for anything.
    assert job0["config"]["directives"], job0
    assert not job1["config"]["directives"], job1["config"]
    assert all(x.get("applied_epoch") is not None for x in job0["config"]["directives"]), job0["config"]
    # Both ranks took the same micro-batch and accumulation at every optimizer step, and changed them
    # at the same one.
    # Each rank trains on its half of the 512 samples: 16 optimizer steps an epoch, 5 epochs.
    assert len(steps[0]) == len(steps[1]) == 5 * 16, (len(steps[0]), len(steps[1]))
    mismatched = [(a, b) for a, b in zip(*steps) if (a["micro"], a["accumulation"]) != (b["micro"], b["accumulation"])]
    assert not mismatched, mismatched[:3]
    assert (steps[0][0]["micro"], steps[0][0]["accumulation"]) == (8, 2), steps[0][0]
    assert (steps[0][-1]["micro"], steps[0][-1]["accumulation"]) == (4, 4), steps[0][-1]
    # The effective batch is kept: each rank's every optimizer step saw micro × accumulation = 16
    # samples, 32 over the two ranks.
    wrong = [s for run in steps for s in run if s["samples"] != 16]
    assert not wrong, wrong[:3]
    # Rank 0 also took its own fewer workers; rank 1's stay its own.
    live = [[w["live"] for w in run if w["kind"] == "workers"] for run in runs]
    assert live[0][0] == 4 and live[0][-1] == 2, live
    assert live[1][0] == 4 and live[1][-1] == 4, live
    ends = [next(r for r in run if r["kind"] == "end") for run in runs]
    assert ends[0]["global_step"] == ends[1]["global_step"] == len(steps[0]), ends
    assert ends[0]["checksum"] == ends[1]["checksum"], ends
    for cg, _, _ in ranks:
        assert cg.oom_kills() == 0
