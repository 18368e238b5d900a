"""The ranks settle a change among themselves over torch.distributed (three gloo ranks on CPU, no
daemon): every rank takes the smallest micro-batch asked for, with the accumulation that keeps its
share of the effective batch; and this holds where numpy is not installed (torch does not need it,
so a user's venv may lack it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[1] / "src"

RANK = r"""
import json, sys
import torch.distributed as dist
from memwatch import _ranks
from memwatch.client import Directives

rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
asked = {1: 4, 2: 2}.get(rank)
mine = None
if asked is not None:
    change = {"knob": "micro_batch", "path": "micro_batch", "old": 8, "new": asked}
    mine = Directives(generation=10 + rank, changes=[{"changes": [change]}], knobs={})
s = _ranks.settle(dist, mine, micro_now=8, per_step=16)
print(json.dumps({"new": s.new, "generation": s.generation, "asked_by": s.asked_by, "why": s.why}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("numpy", ["with numpy", "without numpy"])
def test_ranks_settle_on_the_smallest_micro_batch_asked_for(tmp_path: Path, numpy: str) -> None:
    path = [str(SRC)]
    if numpy == "without numpy":
        blocked = tmp_path / "blocked" / "numpy"
        blocked.mkdir(parents=True)
        (blocked / "__init__.py").write_text(
            'raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n'
        )
        path.insert(0, str(blocked.parent))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), "3", str(store)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(3)
    ]
    out = [p.communicate(timeout=120) for p in ranks]
    for p, (_, err) in zip(ranks, out):
        assert p.returncode == 0, err
    settled = [json.loads(o.strip().splitlines()[-1]) for o, _ in out]
    for rank, s in enumerate(settled):
        assert s["new"] == {"micro_batch": 2, "accumulation": 8}, (rank, s)
        assert s["asked_by"] == [1, 2], (rank, s)
        assert s["why"] is None
    assert [s["generation"] for s in settled] == [None, 11, 12]
