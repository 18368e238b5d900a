"""`memwatch.pytorch.AdaptiveLoader` through memwatch's way out, for real: a job whose 4 DataLoader workers
do not fit its 850 MiB cgroup is paused in its first epoch. (a) On emergency swap (zram) the loader
takes the urgent cut mid-epoch, skips what the epoch has seen, and the run finishes; (b) with only the
checkpoint step, under `memwatch launch`, the loader saves a checkpoint when asked, the job is stopped
cleanly and relaunched, and it resumes where it was with the rewritten config."""

import json
import os
import re
import subprocess

import pytest

pytest.importorskip("torch")

from conftest import BIN, MIB, TRAINERS, python  # noqa: E402
from scenario import GENERIC_KEYS, read  # noqa: E402

CONFIG = {"train": {"micro_batch": 32, "accumulation": 2, "workers": 4, "pin_memory": True}, "epochs": 3}
EFFECTIVE = 64


def warm():
    """torch's libraries loaded once outside the test cgroup, so that their page cache is not charged to it."""
    subprocess.run([python(), "-c", "import torch.utils.data"], check=True)


def check_epochs(records):
    steps = [r for r in records if r["kind"] == "step"]
    assert steps and all(s["samples"] == EFFECTIVE for s in steps), [s for s in steps if s["samples"] != EFFECTIVE][:3]
    for epoch in range(3):
        # `position` counts whole windows trained on: the last window of an epoch starts 64 before its end.
        last = [s for s in steps if s["epoch"] == epoch][-1]
        assert last["position"] + EFFECTIVE == 2048, f"epoch {epoch}'s last window started at {last['position']}"
    return steps


def test_the_loader_takes_an_urgent_cut_mid_epoch_on_emergency_swap(daemon_factory, cgroup_factory, tmp_path):
    warm()
    d = daemon_factory(
        "[policy]\nmax_pause_seconds = 120\n[adapt]\nverify_seconds = 15\n"
        '[way_out]\nsteps = ["swap", "checkpoint"]\ndecide_seconds = 2\nfix_seconds = 40\n'
    )
    cg = cgroup_factory(850 * MIB)
    cfg, out = tmp_path / "train.json", tmp_path / "out.jsonl"
    cfg.write_text(json.dumps(CONFIG))
    p = cg.spawn([python(), str(TRAINERS / "way_out_train.py"), str(cfg), str(out)], d.env())
    assert p.wait(240) == 0
    records = read(out)
    steps = check_epochs(records)
    assert cg.oom_kills() == 0
    # The cut came mid-epoch 0: the loader was rebuilt with 2 workers before the epoch ended.
    epoch0 = [s for s in steps if s["epoch"] == 0]
    assert epoch0[0]["workers"] == 4 and epoch0[-1]["workers"] == 2, (epoch0[0], epoch0[-1])
    assert epoch0[-1]["rebuilds"] >= 2
    assert records[-1]["kind"] == "end" and records[-1]["epochs"] == 3
    text = (d.state / "events.jsonl").read_text()
    assert "of emergency swap (zram)" in text and "applied mid-epoch" in text, text


def test_the_loader_checkpoints_when_asked_and_resumes_after_the_relaunch(daemon_factory, tmp_path):
    warm()
    d = daemon_factory(
        '[policy]\nmax_pause_seconds = 120\n[way_out]\nsteps = ["checkpoint"]\ndecide_seconds = 2\n'
        "checkpoint_grace_seconds = 20\n"
    )
    cfg, out = tmp_path / "train.json", tmp_path / "out.jsonl"
    cfg.write_text(json.dumps(CONFIG))
    keys = [a for k in GENERIC_KEYS for a in ("--key", k)]
    launch = subprocess.run(
        [str(BIN), "launch", "--name", "way-out", "--memory-max", "850M", "--max-restarts", "3",
         "--config-file", str(cfg), "--profile", "generic", *keys, "--socket", str(d.socket), "--",
         python(), str(TRAINERS / "way_out_train.py"), str(cfg), str(out)],
        capture_output=True, text=True, timeout=300,
    )
    text = launch.stdout + launch.stderr + (d.state / "events.jsonl").read_text()
    assert launch.returncode == 0, text
    assert "OOM killer fired" not in text, text
    records = read(out)
    saved = [r for r in records if r["kind"] == "checkpoint"]
    resumed = [r for r in records if r["kind"] == "resumed"]
    assert saved and resumed, text[-3000:]
    # The relaunched run resumed where the checkpoint was, with 2 workers from the rewritten file.
    assert (resumed[0]["epoch"], resumed[0]["position"]) == (saved[-1]["epoch"], saved[-1]["position"])
    assert resumed[0]["workers"] == 2
    assert "the trainer saved its checkpoint" in text, text
    assert "run 2: finished" in text, text
    steps = [r for r in records if r["kind"] == "step"]
    assert all(s["samples"] == EFFECTIVE for s in steps)
    assert records[-1]["kind"] == "end" and records[-1]["epochs"] == 3


HF = {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 2, "dataloader_num_workers": 4,
      "dataloader_pin_memory": True, "num_train_epochs": 2}


def test_the_hf_callback_checkpoints_through_the_trainer_and_the_relaunch_resumes(daemon_factory, tmp_path):
    """The Trainer cannot take the urgent cut mid-epoch: the ladder goes on from emergency swap to
    the checkpoint step, the callback saves through the Trainer, memwatch stops the job, and
    `memwatch launch` relaunches it, resuming from that checkpoint with 2 workers."""
    pytest.importorskip("transformers")
    warm()
    d = daemon_factory(
        "[policy]\nmax_pause_seconds = 120\n"
        '[way_out]\nsteps = ["swap", "checkpoint"]\ndecide_seconds = 2\nfix_seconds = 5\n'
        "checkpoint_grace_seconds = 30\n"
    )
    cfg, out = tmp_path / "train.json", tmp_path / "out.jsonl"
    cfg.write_text(json.dumps(HF))
    launch = subprocess.run(
        [str(BIN), "launch", "--name", "hf-way-out", "--memory-max", "850M", "--max-restarts", "3",
         "--config-file", str(cfg), "--profile", "hf", "--socket", str(d.socket), "--",
         python(), str(TRAINERS / "hf_way_out.py"), str(cfg), str(out)],
        capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONPATH=str(TRAINERS)),
    )
    text = launch.stdout + launch.stderr[-3000:] + (d.state / "events.jsonl").read_text()
    assert launch.returncode == 0, text
    assert "OOM killer fired" not in text, text
    # The room was sized from the growth when the pause began, not the nil growth of a paused job
    # (with a 0 MiB shortfall the swap filled before the Trainer reached a step, and it never saved).
    shortfalls = [int(m) for m in re.findall(r"shortfall (\d+) MiB", text)]
    assert shortfalls and shortfalls[0] > 0, text
    records = read(out)
    starts = [r for r in records if r["kind"] == "start"]
    assert [s["resumed"] for s in starts][:2] == [False, True], text
    assert starts[-1]["workers"] == 2, starts
    assert any(r["kind"] == "saved" for r in records), records
    assert "the trainer saved its checkpoint" in text and "run 2: finished" in text, text
    end = [r for r in records if r["kind"] == "end"][-1]
    # The relaunched Trainer resumed at the checkpoint's step and ended where one run would have.
    assert end["global_step"] == end["max_steps"] == 2 * 4096 // 64, end
    assert end["epoch"] == pytest.approx(2.0), end
