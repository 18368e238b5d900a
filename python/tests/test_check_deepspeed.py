"""`memwatch check --json` against DeepSpeed's own estimator functions (pip deepspeed, on CPU): every
layout, over a grid of model sizes, GPUs per node and nodes, within 1 %; and every emitted DeepSpeed
config loads in DeepSpeed's config class with its world size."""

import json
import subprocess

import pytest

from conftest import BIN

zero2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
zero3 = pytest.importorskip("deepspeed.runtime.zero.stage3")

PARAMS = [1e8, 3.5e8, 1.5e9, 7e9, 7e10]
PER_NODE = [1, 2, 8]
NODES = [1, 2, 4]
LAYER = {1e8: 1e7, 3.5e8: 5.2e7, 1.5e9: 5e7, 7e9: 1.31e8, 7e10: 1e9}


def check(params, per_node, nodes, *extra):
    out = subprocess.run(
        [str(BIN), "check", "--json", "--params", repr(params), "--largest-layer", repr(LAYER[params]),
         "--gpus", str(per_node), "--nodes", str(nodes), *extra],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout), out.returncode


def deepspeed(params, per_node, nodes):
    """(host RAM per node, per GPU) for each layout, from DeepSpeed's functions (zero_init, factor 1.5)."""
    z2 = lambda off: zero2.estimate_zero2_model_states_mem_needs(params, per_node, nodes, cpu_offload=off)  # noqa: E731
    z3 = lambda off, offp: zero3.estimate_zero3_model_states_mem_needs(  # noqa: E731
        params, LAYER[params], per_node, nodes, cpu_offload=off, cpu_offload_params=offp, zero_init=True)[:2]
    return {
        "ZeRO-2": z2(False),
        "ZeRO-2 + CPU optimizer offload": z2(True),
        "ZeRO-3": z3(False, False),
        "ZeRO-3 + CPU optimizer offload": z3(True, False),
        "ZeRO-3 + CPU offload (params and optimizer)": z3(True, True),
    }


def close(got, want):
    return abs(got - want) <= 0.01 * max(want, 1)


@pytest.mark.parametrize("params", PARAMS)
def test_every_layout_agrees_with_deepspeeds_estimators(params):
    mismatches = []
    for per_node in PER_NODE:
        for nodes in NODES:
            report, _ = check(params, per_node, nodes, "--gpu-memory-gib", "80", "--ram-gib", "4096")
            want = deepspeed(params, per_node, nodes)
            got = {v["option"]["name"]: v["option"] for v in report["report"]["verdicts"]}
            assert set(got) == set(want)
            for name, (cpu, gpu) in want.items():
                o = got[name]
                if not (close(o["cpu_bytes"], cpu) and close(o["gpu_bytes"], gpu)):
                    mismatches.append((per_node, nodes, name, o["cpu_bytes"], cpu, o["gpu_bytes"], gpu))
    assert not mismatches, mismatches


@pytest.mark.parametrize("params,per_node,nodes,gpu_gib,ram_gib", [
    (1.5e9, 1, 1, 24, 64), (7e9, 8, 1, 40, 512), (7e9, 8, 1, 40, 64), (7e10, 8, 2, 80, 1024), (1e8, 2, 1, 3, 8),
])
def test_every_emitted_deepspeed_config_loads_with_its_world_size(
    params, per_node, nodes, gpu_gib, ram_gib, monkeypatch
):
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # Outside a launched job there is no process group: this rank is 0 of the world the mpu gives.
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    report, code = check(params, per_node, nodes, "--gpu-memory-gib", str(gpu_gib), "--ram-gib", str(ram_gib))
    if code == 3:
        assert report["deepspeed"] is None and report["accelerate"] is None
        return  # nothing fits: no config is emitted (checked)
    ds = report["deepspeed"]
    chosen = report["report"]["recommendation"]["option"]
    assert ds["zero_optimization"]["stage"] == chosen["zero_stage"]
    assert (ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu") == chosen["offload_optimizer"]
    world = per_node * nodes

    class Mpu:  # DeepSpeedConfig takes the data-parallel world size from an mpu
        def __init__(self, world):
            self.world = world

        def get_data_parallel_world_size(self):
            return self.world

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_world_size(self):
            return 1

        def get_model_parallel_rank(self):
            return 0

    cfg = DeepSpeedConfig(ds, mpu=Mpu(world))
    assert cfg.world_size == world
    assert cfg.train_batch_size == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world
    assert cfg.zero_optimization_stage == chosen["zero_stage"]
    # DeepSpeed does check it: the same config for another world size is refused.
    with pytest.raises(AssertionError, match="train_batch_size"):
        DeepSpeedConfig(ds, mpu=Mpu(world + 1))


@pytest.mark.parametrize("params,per_node,nodes", [(1.5e9, 1, 1), (7e9, 8, 1), (7e10, 8, 2)])
def test_every_emitted_accelerate_config_loads_and_carries_only_what_accelerate_reads(
    params, per_node, nodes, tmp_path
):
    import re

    import accelerate.commands.config.cluster as questionnaire
    from accelerate.commands.config.config_args import ClusterConfig

    report, code = check(params, per_node, nodes, "--gpu-memory-gib", "80", "--ram-gib", "2048")
    assert code == 0, report["report"]["recommendation"]["notes"]
    path = tmp_path / "accelerate.yaml"
    path.write_text(report["accelerate"])
    # The loader refuses unknown top-level keys.
    cfg = ClusterConfig.from_yaml_file(str(path))
    assert cfg.num_machines == nodes and cfg.num_processes == per_node * nodes
    assert cfg.distributed_type == "DEEPSPEED"
    # Inside deepspeed_config it takes anything: compare with the keys accelerate's own
    # questionnaire writes there (the ones its launcher reads).
    known = set(re.findall(r'deepspeed_config\["([a-z_0-9]+)"\]', open(questionnaire.__file__).read()))
    assert known, "accelerate's questionnaire no longer names its deepspeed_config keys"
    assert set(cfg.deepspeed_config) <= known, set(cfg.deepspeed_config) - known
    chosen = report["report"]["recommendation"]["option"]
    assert cfg.deepspeed_config["zero_stage"] == chosen["zero_stage"]


def _configs():
    import transformers as t

    return {
        "gpt2": (t.GPT2Config(), t.GPT2LMHeadModel),
        "llama": (t.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                num_attention_heads=32, vocab_size=32000), t.LlamaForCausalLM),
        "mistral": (t.MistralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=32000),
                    t.MistralForCausalLM),
        "bert": (t.BertConfig(), t.BertModel),
        "t5": (t.T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12), t.T5ForConditionalGeneration),
    }


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "bert", "t5"])
def test_a_hugging_face_config_gives_the_models_own_parameter_count(arch, tmp_path):
    """Built on the meta device from the config (nothing downloaded, no memory used), the model's
    own parameter count is what `--model-config` reads from the config.json."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    cfg, cls = _configs()[arch]
    with torch.device("meta"):
        model = cls(cfg)
    count = sum(p.numel() for p in model.parameters())
    path = tmp_path / "config.json"
    cfg.to_json_file(str(path))
    out = subprocess.run([str(BIN), "check", "--json", "--model-config", str(path), "--gpus", "8",
                          "--gpu-memory-gib", "80", "--ram-gib", "1024"], capture_output=True, text=True)
    assert out.returncode in (0, 3), out.stderr
    model_seen = json.loads(out.stdout)["report"]["model"]
    assert abs(model_seen["params"] - count) <= 0.01 * count, (arch, model_seen["params"], count)
    assert model_seen["layers"] and model_seen["hidden"] and model_seen["heads"]
